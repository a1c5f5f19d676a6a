"""Pictures of where an error sits: SVG heatmap and singular values, embedded in the report,
taken from the run that was judged (harness/judging/details.py)."""

import dataclasses
import re

import numpy as np
import pytest

from cases import Case
from harness.judging.details import Pictures
from harness.judging.outcome import Evidence
from harness.runner import run_case
from harness.targets import load_target
from reports import RunInfo, render_html
from reports.pictures import axis_labels, case_pictures, heatmap_svg, singular_values_svg
from reports.records import Record

INFO = RunInfo(target="t", tier="ci", backends="cpu", command="c", started="s", seconds=1.0, torch_version="2.13")


def record(case_id, status="fail", ratio=3.0):
    return Record(case_id=case_id, check="reference", target="t", backend="cpu", world_size=1, layout="single",
                  optimizer="muon", layer="conv2d", shape="8x4x3x3", megabatch=1, flatten=True, param_dtype="fp32",
                  compute_dtype="fp32", orthogonalizer="svd", status=status, ratio=ratio)


def test_heatmap_has_one_cell_per_element_and_the_darkest_where_the_error_is():
    err = np.full((4, 6), 1e-9)
    err[2, 5] = 1e-2
    svg = heatmap_svg(err)
    cells = re.findall(r'<rect x="(\d+)" y="(\d+)"[^>]*fill="rgb\((\d+),(\d+),(\d+)\)"', svg)
    assert len(cells) == 24
    darkest = min(cells, key=lambda c: int(c[2]) + int(c[3]))
    size = int(re.search(r'<rect x="\d+" y="\d+" width="(\d+)"', svg).group(1))
    assert (int(darkest[0]) // size, int(darkest[1]) // size) == (5, 2)
    assert "[2, 5] 0.01" in svg


def test_heatmap_flattens_a_conv_update_to_output_channel_rows():
    assert len(re.findall("<rect", heatmap_svg(np.ones((8, 4, 3, 3))))) == 8 * 36


def test_singular_value_chart_draws_both_series_even_with_zeros():
    svg = singular_values_svg(np.array([1.0, 0.5, 0.0]), np.array([1.0, 1.0, 1.0]))
    assert svg.count("<polyline") == 2 and "judged" in svg and "oracle" in svg
    assert singular_values_svg(np.zeros(3), np.zeros(3)).count("<polyline") == 2


def test_report_embeds_pictures_in_the_record_detail_and_stays_offline():
    picked = record("muon/a", status="pass", ratio=0.5)
    others = [record(f"muon/b{i}", status="pass", ratio=0.1) for i in range(30)]
    picture = case_pictures("member 0 step 1", np.ones((2, 3)), np.ones(2), np.ones(2))
    html = render_html([picked, *others], INFO, {picked.key: picture})
    block = html[html.index('id="case-muon_a--reference"'):]
    block = block[:block.index("</details>")]
    assert "<svg" in block and "worst step: member 0 step 1" in block
    assert "http://" not in html and "https://" not in html


def test_pictures_are_keyed_by_the_whole_record_key():
    """The same case and check on two backends: only the record whose key has a picture shows it."""
    cpu, gloo = record("muon/a", "fail"), record("muon/a", "fail")
    gloo = Record(**{**cpu.__dict__, "backend": "gloo", "world_size": 2})
    html = render_html([cpu, gloo], INFO, {gloo.key: "<svg>GLOO</svg>"})
    blocks = [b[:b.index("</details>")] for b in html.split("<details")[1:]]
    assert [("GLOO" in b, "<td>gloo</td>" in b) for b in blocks] == [(False, False), (True, True)]


def test_heatmap_caption_is_html_text_outside_the_picture():
    """The caption wraps as text in a <figcaption>; the SVG is exactly as wide as its cells."""
    err = np.ones((2, 3)) * 1e-3
    fragment = case_pictures("member 0 step 1", err, np.ones(2), np.ones(2))
    svg = heatmap_svg(err)
    assert "<text" not in svg
    cell = int(re.search(r'<rect x="\d+" y="\d+" width="(\d+)"', svg).group(1))
    assert f'width="{3 * cell}" height="{2 * cell}"' in svg
    assert re.search(r"<figcaption>\|err\| per element[^<]*max 0.001", fragment)


def test_singular_value_axis_labels_tell_their_ends_apart():
    """Regression: a range within one decade had two labels that both read 0.04."""
    (lo, lo_text), (hi, hi_text) = axis_labels(0.0412, 0.0449)
    assert (lo, hi) == (0.0412, 0.0449) and lo_text != hi_text and (lo_text, hi_text) == ("0.041", "0.045")
    assert [t for _, t in axis_labels(0.04101, 0.04109)] == ["0.041", "0.0411"]
    assert [v for v, _ in axis_labels(0.0039, 0.045)] == [0.0039, 0.01, 0.045]
    decades = axis_labels(2e-4, 3.0)
    assert [v for v, _ in decades] == [1e-3, 1e-2, 1e-1, 1.0]
    assert all(f'font-size="8">{k}</tspan>' in t for (_, t), k in zip(decades, (-3, -2, -1, 0)))
    svg = singular_values_svg(np.array([0.0449, 0.043]), np.array([0.0441, 0.0412]))
    assert ">0.041<" in svg and ">0.045<" in svg


def test_pictures_keep_only_the_worst_reference_checks_that_ran():
    """Bounded memory: of many offers the `limit` worst stay, worst first; checks other than reference,
    records that did not run and NaN ratios are never kept."""
    keeper = Pictures(limit=3)
    evidence = Evidence("member 0 step 1", np.ones((2, 3)), np.zeros((2, 3)))
    for i, ratio in enumerate([0.5, 4.0, 0.1, 2.0, 0.9, 3.0]):
        keeper.offer(record(f"muon/r{i}", "fail" if ratio > 1 else "pass", ratio), evidence)
    keeper.offer(record("muon/nan", "fail", float("nan")), evidence)
    keeper.offer(record("muon/skip", "skipped", float("nan")), evidence)
    keeper.offer(Record(**{**record("muon/mb", "fail", 99.0).__dict__, "check": "megabatch"}), evidence)
    assert [d.key[0] for d in keeper.details()] == ["muon/r1", "muon/r5", "muon/r3"]
    assert np.array_equal(keeper.details()[0].error, np.ones((2, 3)))


def test_pictures_refuse_a_negative_limit():
    with pytest.raises(ValueError, match="limit"):
        Pictures(limit=-1)


def test_a_distributed_records_picture_is_its_distributed_run():
    """The picture of a distributed record comes from the trajectory its ranks produced, keyed by the
    record's full key (backend gloo): for a Muon that orthogonalizes each local shard the picture
    shows the shard error, where a single-process rerun of the same target would show none."""
    spec = "harness.targets.distributed_controls:local_shard"
    case = Case(layer="conv2d", megabatch=3, flatten=True, param_dtype="fp32", compute_dtype="fp32",
                orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=True, weight_decay=0.1,
                steps=2, grad="gaussian", layout="shard0", world_size=2)
    target = load_target(spec)
    kept = Pictures()
    reference = next(r for r in run_case(case, target, spec, pictures=kept) if r.check == "reference")
    (detail,) = kept.details()
    assert reference.status == "fail" and detail.key == reference.key and reference.backend == "gloo"
    assert float(np.max(np.abs(detail.error))) == reference.max_abs  # the very step the record was judged on
    assert f"worst at {detail.where}:" in reference.message
    alone = Pictures()
    run_case(dataclasses.replace(case, layout="single", world_size=1), target, spec, pictures=alone)
    (single,) = alone.details()
    assert single.key[3] == "cpu"
    assert np.max(np.abs(single.error)) < 1e-3 * np.max(np.abs(detail.error))

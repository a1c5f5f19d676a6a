"""Pictures of where an error sits: SVG heatmap and singular values, embedded in the report."""

import re

import numpy as np

from reports import RunInfo, render_html
from reports.pictures import case_pictures, heatmap_svg, singular_values_svg
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
    html = render_html([picked, *others], INFO, {("muon/a", "reference"): picture})
    block = html[html.index('id="case-muon_a--reference"'):]
    block = block[:block.index("</details>")]
    assert "<svg" in block and "worst step: member 0 step 1" in block
    assert "http://" not in html and "https://" not in html

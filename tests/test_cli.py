"""The command line: usage errors are one line and exit 2 before any case runs; stored runs are
only compared when comparable; outputs never land inside a run being read; `list`; progress;
an interrupted run is written and marked incomplete."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness.apps.cli as cli
from harness.running.progress import Progress
from reports.records import Record, RunInfo
from reports.store import save_run

ROOT = Path(__file__).parent.parent
CASE = "muon/conv1d-8x4x5/mb2/flat/fp32@fp32/ns/rms_norm/nesterov/wd0.1/steps1/gaussian/seed0"
OTHER = "muon/conv1d-8x4x5/mb2/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0/steps3/lowrank/seed0"
INFO = RunInfo(target="ours [ours] 0.1.0", tier="ci", backends="cpu", command="python -m harness run",
               started="2025-01-02T03:04:05+00:00", seconds=1.0, torch_version="2.13.0+cpu", commit="abc1234")


def rec(case_id: str, status: str = "pass", ratio: float = 0.5, **overrides: object) -> Record:
    fields = dict(check="reference", target="ours", backend="cpu", world_size=1, layout="single", optimizer="muon",
                  layer="conv1d", shape="8x4x5", megabatch=2, flatten=True, param_dtype="fp32",
                  compute_dtype="fp32", orthogonalizer="ns")
    fields.update(overrides)
    return Record(case_id=case_id, status=status, ratio=ratio, **fields)  # type: ignore[arg-type]


def stored(path: Path, records: list[Record], **info: object) -> Path:
    save_run(records, dataclasses.replace(INFO, **info), path)
    return path


@pytest.fixture
def no_case_runs(monkeypatch):
    """Fail the test if the CLI starts running cases."""
    def refuse(*args, **kwargs):
        raise AssertionError("a case ran although the command line was bad")

    monkeypatch.setattr(cli, "run", refuse)


def usage_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit status 2 and exactly one line on stderr; return that line."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_an_unusable_out_is_a_usage_error_before_any_case_runs(tmp_path, capsys, no_case_runs):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "exists and is not a directory" in usage_error(capsys, ["run", "--select", CASE, "--out", str(a_file)])
    assert "cannot write there" in usage_error(capsys, ["run", "--select", CASE, "--out", str(a_file / "sub")])
    assert "0.0 MiB free on its filesystem" in usage_error(capsys, ["run", "--select", CASE, "--out",
                                                                    "/proc/harness-out"])
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "cannot write there" in usage_error(capsys, ["run", "--select", CASE, "--out", str(locked)])


def test_a_missing_baseline_is_a_usage_error_before_any_case_runs(tmp_path, capsys, no_case_runs):
    line = usage_error(capsys, ["run", "--select", CASE, "--baseline", str(tmp_path / "none"),
                                "--out", str(tmp_path / "out")])
    assert "none: not a directory" in line
    assert not (tmp_path / "out").exists()


def test_a_target_that_raises_on_import_is_a_usage_error(tmp_path, capsys, monkeypatch, no_case_runs):
    (tmp_path / "broken_target.py").write_text("raise RuntimeError('cannot find my GPU kernels')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = usage_error(capsys, ["run", "--target", "broken_target:target", "--out", str(tmp_path / "out")])
    assert "broken_target:target" in line and "RuntimeError: cannot find my GPU kernels" in line


USER_MODULE = """
import torch

from harness.targets.ours import OursMuon


class TinyMuon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02):
        super().__init__(params, dict(lr=lr))


def make(momentum):
    return OursMuon()


def not_a_target():
    return TinyMuon([torch.zeros(2, requires_grad=True)])
"""


@pytest.mark.parametrize("spec, expected", [
    ("tourch", "error: target 'tourch' is neither an alias nor MODULE:CALLABLE; did you mean 'torch'?"),
    ("ours-trition", "error: target 'ours-trition' is neither an alias nor MODULE:CALLABLE; did you mean 'ours-triton'?"),
    ("qqqq", "error: target 'qqqq' is neither an alias nor MODULE:CALLABLE (the 25 aliases: harness.targets.ALIASES)"),
    ("user_module:TinyMuon", "error: target 'user_module:TinyMuon': the callable must return a harness Target, and "
                             "TinyMuon is a torch.optim.Optimizer class that needs params; name a function that "
                             "returns an adapter (OptimizerTarget)"),
    ("user_module:make", "and make is a callable that needs momentum;"),
    ("user_module:not_a_target", "error: target 'user_module:not_a_target': the callable must return a harness "
                                 "Target; not_a_target() returned TinyMuon"),
])
def test_a_target_that_is_no_target_factory_is_a_short_usage_error(tmp_path, capsys, monkeypatch, no_case_runs,
                                                                    spec, expected):
    """A typo'd alias names the nearest alias, not all of them; a class or a function that needs arguments,
    or one that returns no Target, says that the callable must return a harness Target."""
    (tmp_path / "user_module.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    line = usage_error(capsys, ["run", "--target", spec, "--out", str(tmp_path / "out")])
    assert expected in line and len(line) < 250, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spec, name", [("torch", "torch"), ("harness.targets.ours:OursMuon", "ours"),
                                        ("harness.targets.ours:target", "ours")])
def test_an_alias_a_target_class_and_a_factory_load(spec, name):
    """The positive side of the test above: what it refuses is only what is no Target factory."""
    assert cli.load_target(spec).name == name


@pytest.mark.parametrize("argv, message", [
    (["run", "--backend", "cpu,cpu"], "names cpu more than once"),
    (["run", "--growth", "nan"], "argument --growth: expected a finite number >= 1, got 'nan'"),
    (["run", "--growth", "0.5"], "expected a finite number >= 1"),
    (["diff", "a", "b", "--growth", "inf"], "expected a finite number >= 1, got 'inf'"),
    (["run", "--timeout", "0"], "argument --timeout: expected a finite number > 0"),
    (["run", "--timeout", "nan"], "argument --timeout"),
    (["list", "--select", "conv2d-8x4x3x4/mb3"], "nearest: conv2d-8x4x3x3/mb3"),
])
def test_bad_options_are_one_line_usage_errors(tmp_path, capsys, no_case_runs, argv, message):
    assert message in usage_error(capsys, [*argv, *(["--out", str(tmp_path / "o")] if argv[0] != "list" else [])])


def test_runs_of_different_tiers_or_targets_are_not_compared_unless_forced(tmp_path, capsys):
    base = stored(tmp_path / "base", [rec(CASE)])
    nightly = stored(tmp_path / "nightly", [rec(CASE)], tier="nightly")
    other = stored(tmp_path / "other", [rec(CASE, target="torch")])
    line = usage_error(capsys, ["diff", str(base), str(nightly), "--out", str(tmp_path / "d")])
    assert "not comparable (tier 'ci' vs 'nightly')" in line and "--force" in line
    assert "targets 'ours' vs 'torch'" in usage_error(capsys, ["diff", str(base), str(other), "--out",
                                                               str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()
    assert cli.main(["diff", str(base), str(other), "--out", str(tmp_path / "d"), "--force"]) == 1  # vanished pass
    assert (tmp_path / "d" / "diff.md").exists()
    assert cli.main(["diff", str(base), str(base), "--out", str(tmp_path / "same")]) == 0


def test_an_incomplete_or_differently_selected_run_is_not_comparable(tmp_path, capsys):
    base = stored(tmp_path / "base", [rec(CASE), rec(OTHER)])
    part = stored(tmp_path / "part", [rec(CASE)], interrupted="SIGTERM after 1 of 2 cases")
    chosen = stored(tmp_path / "chosen", [rec(CASE)], selection=("steps1",))
    assert "complete True vs False" in usage_error(capsys, ["diff", str(base), str(part), "--out", str(tmp_path / "d")])
    assert "selection '(all)' vs 'steps1'" in usage_error(capsys, ["diff", str(base), str(chosen), "--out",
                                                                   str(tmp_path / "d")])


def test_a_baseline_of_another_tier_is_refused_before_any_case_runs(tmp_path, capsys, no_case_runs):
    nightly = stored(tmp_path / "nightly", [rec(CASE)], tier="nightly")
    line = usage_error(capsys, ["run", "--select", CASE, "--baseline", str(nightly), "--out", str(tmp_path / "o")])
    assert "not comparable (tier 'nightly' vs 'ci')" in line


def test_run_select_with_a_baseline_compares_only_the_selected_cases(tmp_path, capsys):
    base, head = tmp_path / "base", tmp_path / "head"
    assert cli.main(["run", "--select", CASE, "--select", OTHER, "--out", str(base), "--quiet"]) == 0
    assert cli.main(["run", "--select", CASE, "--baseline", str(base), "--out", str(head), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "no regression" in err and "vanished" not in err, err
    assert cli.main(["diff", str(base), str(head), "--out", str(tmp_path / "d"), "--force"]) == 1  # the whole base


@pytest.mark.parametrize("command", ["diff", "trend"])
def test_diff_and_trend_write_outside_the_runs_they_read(tmp_path, capsys, monkeypatch, command):
    base = stored(tmp_path / "base", [rec(CASE)])
    head = stored(tmp_path / "head", [rec(CASE)], started="2025-01-03T03:04:05+00:00")  # another run
    before = sorted(p.name for p in base.iterdir())
    for out in (base, head / "sub"):
        assert "a run this command reads" in usage_error(capsys, [command, str(base), str(head), "--out", str(out)])
    monkeypatch.chdir(tmp_path)
    assert cli.main([command, str(base), str(head)]) == 0
    assert (tmp_path / f"{command}-out" / f"{command}.html").exists()
    assert sorted(p.name for p in base.iterdir()) == before


def test_run_refuses_an_out_inside_its_baseline(tmp_path, capsys, no_case_runs):
    base = stored(tmp_path / "base", [rec(CASE)])
    assert "a run this command reads" in usage_error(capsys, ["run", "--select", CASE, "--baseline", str(base),
                                                              "--out", str(base)])


TIER_CASE = "muon/conv1d-8x4x5/mb3/flat/fp32@fp32/ns/spectral_norm/plain/wd0/steps1/lowrank/seed0"
"""A case of the CI tier (CASE is a full id that runs outside it)."""


def test_list_prints_ids_and_their_count(capsys):
    assert cli.main(["list", "--select", "conv1d-8x4x5/mb3/flat/fp32@fp32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert TIER_CASE in lines and lines[-1] == f"{len(lines) - 1} cases"
    assert all("conv1d-8x4x5/mb3/flat/fp32@fp32" in line for line in lines[:-1])
    assert cli.main(["list", "--select", CASE]) == 0  # a full id lists even outside the tier
    assert capsys.readouterr().out.splitlines() == [CASE, "1 cases"]


def test_list_coverage_prints_the_summary_of_cases_coverage(capsys):
    assert cli.main(["list", "--select", TIER_CASE, "--coverage"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [TIER_CASE, "1 cases"]
    assert any("single-process" in line and "1 cases" in line and "INCOMPLETE" in line for line in lines[2:])


def test_progress_prints_rates_and_time_left_at_least_every_interval_even_inside_a_case():
    stream = io.StringIO()
    with Progress(stream, total=4, interval=0.2) as progress:
        time.sleep(0.75)  # one long first case: the thread still reports
        progress.case_done("a", [rec("a"), rec("a", status="fail", ratio=3.0)])
        time.sleep(0.45)
    lines = stream.getvalue().splitlines()
    status = [line for line in lines if line.startswith("[")]
    assert len(status) >= 4, lines
    assert status[0].startswith("[    0/    4]") and "time left unknown yet" in status[0]
    assert "  FAIL  reference a  ratio 3" in lines
    last = status[-1]
    assert last.startswith("[    1/    4]") and "2 checks, 1 failing" in last
    rate = float(re.search(r"([\d.]+) cases/s", last).group(1))
    assert 0.1 < rate <= 1 / 0.75 and re.search(r"[\d.]+ checks/s, ~\d+s left", last), last


def test_sigint_writes_the_finished_cases_marked_incomplete(tmp_path):
    out = tmp_path / "out"
    # The nightly tier's linear cases run for minutes: the first status line after the first finished
    # case (one every progress interval, 10 s) comes while more remain, on a quiet machine too (the CI
    # tier's linear cases can all finish within one interval).
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--tier", "nightly", "--select", "linear",
                             "--out", str(out)],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # the first status line with a finished case and more to go (within ~10 s)
        seen.append(line)
        status = re.match(r"\[\s*(\d+)/\s*(\d+)\]", line)
        if status and 0 < int(status.group(1)) < int(status.group(2)):
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 128 + signal.SIGINT, "".join(seen) + rest
    assert "interrupted by SIGINT after" in rest and "Traceback" not in rest, rest
    done = int(re.search(r"after (\d+) of (\d+) cases", rest).group(1))
    context = json.loads((out / "run.json").read_text())
    assert context["complete"] is False and context["interrupted"].startswith("SIGINT after")
    assert 0 < context["records"] and len({r.split(",")[0] for r in (out / "results.csv").read_text().splitlines()[1:]}) == done
    assert "INCOMPLETE" in (out / "summary.md").read_text() and "INCOMPLETE" in (out / "report.html").read_text()
    assert math.isfinite(context["seconds"])


def test_timeout_reaches_the_runner(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cases, target, spec, backend, progress, ranks, *, timeout, pictures, journal):
        seen[backend] = timeout
        return []

    monkeypatch.setattr(cli, "run", fake_run)
    assert cli.main(["run", "--select", CASE, "--timeout", "7.5", "--out", str(tmp_path / "a"), "--quiet"]) == 1
    assert seen == {"cpu": 7.5}
    assert cli.main(["run", "--select", CASE, "--out", str(tmp_path / "b"), "--quiet"]) == 1  # nothing checked
    assert seen == {"cpu": None} and json.loads((tmp_path / "b" / "run.json").read_text())["complete"] is True


def test_out_at_a_stored_run_is_refused_unless_replace_and_so_is_a_folder_of_other_files(tmp_path, capsys,
                                                                                        no_case_runs):
    old = stored(tmp_path / "old", [rec(CASE)])
    line = usage_error(capsys, ["run", "--select", CASE, "--out", str(old)])
    assert "holds a stored run; --replace replaces it" in line
    assert "--replace" in cli._parser()._subparsers._group_actions[0].choices["run"].format_help()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.tex").write_text("mine")
    for extra in ([], ["--replace"]):
        assert "holds 1 entries and no stored run" in usage_error(capsys, ["run", "--select", CASE, "--out",
                                                                           str(busy), *extra])
    assert [p.name for p in busy.iterdir()] == ["thesis.tex"]
    assert [r.case_id for r in cli.load_run(old)[0]] == [CASE]


def test_out_at_the_filesystem_root_writes_nothing_there(capsys, no_case_runs):
    before = sorted(os.listdir("/"))
    line = usage_error(capsys, ["run", "--select", CASE, "--out", "/"])
    assert "--out /: the filesystem root cannot hold a run" in line
    assert sorted(os.listdir("/")) == before


def test_replace_swaps_the_stored_run_for_the_new_one(tmp_path, capsys):
    old = stored(tmp_path / "out", [rec("old/id", status="fail", ratio=9.0)], tier="nightly")
    assert cli.main(["run", "--select", CASE, "--out", str(old), "--replace", "--quiet"]) == 0
    records, context = cli.load_run(old)
    assert {r.case_id for r in records} == {CASE} and context["tier"] == "ci"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it


@pytest.mark.slow
def test_a_second_writer_to_the_same_out_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "harness", "run", "--tier", "nightly", "--select", "linear",
                              "--out", str(out)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        for line in first.stderr:  # the first status line: the run holds its folder and judges cases
            if line.startswith("["):
                break
        second = subprocess.run([sys.executable, "-m", "harness", "run", "--select", CASE, "--out", str(out)],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"another run (process {first.pid}) is writing there" in lines[0]
        first.send_signal(signal.SIGINT)
        first.stderr.read()
        assert first.wait(timeout=120) == 128 + signal.SIGINT
    finally:
        first.kill()
        first.wait()
    records, context = cli.load_run(out)
    assert records and context["complete"] is False and all("linear" in r.case_id for r in records)


def test_a_file_size_limit_is_refused_before_any_case_and_the_old_run_stays(tmp_path):
    old = stored(tmp_path / "out", [rec(OTHER)])
    before = {p.name: p.read_bytes() for p in old.iterdir()}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))

    result = subprocess.run([sys.executable, "-m", "harness", "run", "--select", CASE, "--out", str(old), "--replace"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "files are limited to 1.0 MiB (ulimit -f)" in lines[0]
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert [r.case_id for r in cli.load_run(old)[0]] == [OTHER]


KILLED_WRITE = """
import sys, time
import reports.store
def pause(records, path):
    open(path, "w").write("case_id")
    print("PAUSED", flush=True)
    time.sleep(600)
reports.store.write_csv = pause
from harness.apps.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _watchers_of(out: Path) -> list[int]:
    """Pids of the journal watchers (harness/apps/journal.py) of runs into `out` (Linux /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if b"harness.apps.journal" in args and str(out).encode() in args:
            found.append(int(proc.name))
    return found


def test_a_run_killed_while_it_writes_leaves_the_old_run_and_no_lock(tmp_path):
    old = stored(tmp_path / "out", [rec(OTHER)])
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITE, "run", "--select", CASE, "--out", str(old),
                              "--replace", "--quiet"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "PAUSED\n"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
    # The killed run's journal watcher (harness/apps/journal.py) then stores what finished, marked incomplete,
    # under the folder's lock: the store holds the old run or that one, never a torn write. (Read before the
    # watcher ended, the test raced it: the next run found its lock, exit 2.)
    deadline = time.monotonic() + 60
    while _watchers_of(old) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _watchers_of(old)
    records, context = cli.load_run(old)
    assert [r.case_id for r in records] == [OTHER] or (
        {r.case_id for r in records} == {CASE} and context["complete"] is False), context
    assert cli.main(["run", "--select", CASE, "--out", str(old), "--replace", "--quiet"]) == 0
    assert {r.case_id for r in cli.load_run(old)[0]} == {CASE}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_a_corrupt_store_is_one_line_and_exit_2_in_diff_and_before_any_case_in_run_baseline(tmp_path, capsys,
                                                                                            no_case_runs):
    base, head = stored(tmp_path / "base", [rec(CASE)]), stored(tmp_path / "head", [rec(CASE)], seconds=2.0)
    flip(base / "results.parquet", 11)
    expected = "results.parquet is not the file this run wrote"
    assert expected in usage_error(capsys, ["diff", str(base), str(head), "--out", str(tmp_path / "d")])
    assert expected in usage_error(capsys, ["run", "--select", CASE, "--baseline", str(base), "--out",
                                            str(tmp_path / "o")])
    assert not (tmp_path / "d").exists() and not (tmp_path / "o").exists()
    context = json.loads((head / "run.json").read_text())
    (head / "run.json").write_text(json.dumps({**context, "files": None}))
    assert "files=None" in usage_error(capsys, ["diff", str(head), str(head), "--out", str(tmp_path / "d")])


def test_a_store_without_digests_is_refused_unless_allow_undigested(tmp_path, capsys):
    base, head = stored(tmp_path / "base", [rec(CASE)]), stored(tmp_path / "head", [rec(CASE)], seconds=2.0)
    (base / "run.json").unlink()
    line = usage_error(capsys, ["diff", str(base), str(head), "--out", str(tmp_path / "d")])
    assert "no digests vouch for results.parquet" in line and "--allow-undigested" in line
    assert cli.main(["diff", str(base), str(head), "--out", str(tmp_path / "d"), "--allow-undigested",
                     "--force"]) == 0


def test_trend_refuses_runs_of_different_tiers_unless_forced_and_one_run_twice(tmp_path, capsys):
    ci = stored(tmp_path / "ci", [rec(CASE)])
    later = stored(tmp_path / "later", [rec(CASE, ratio=0.7)], started="2025-01-03T03:04:05+00:00")
    nightly = stored(tmp_path / "nightly", [rec(CASE)], tier="nightly", started="2025-01-04T03:04:05+00:00")
    out = ["--out", str(tmp_path / "t")]
    assert "not comparable (tier 'ci' vs 'nightly')" in usage_error(capsys, ["trend", str(ci), str(nightly), *out])
    assert "are the same run" in usage_error(capsys, ["trend", str(ci), str(later), str(ci), *out])
    shutil.copytree(ci, tmp_path / "copy")
    assert "are the same run" in usage_error(capsys, ["trend", str(ci), str(tmp_path / "copy"), *out])
    assert not (tmp_path / "t").exists()
    assert cli.main(["trend", str(ci), str(later), *out]) == 0  # negative control: two runs of one tier
    assert cli.main(["trend", str(ci), str(later), str(nightly), "--force", *out]) == 0
    assert "over 3 runs" in (tmp_path / "t" / "trend.html").read_text()


FULL_DISK = """
import errno, os, sys
import reports.store
def full(records, path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
reports.store.write_csv = full
from harness.apps.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_write_that_fails_after_the_cases_ran_is_one_line_exit_2_and_the_old_run_stays(tmp_path):
    """A disk that fills while the run is written (after every check passed): one line, no traceback."""
    old = stored(tmp_path / "out", [rec(OTHER)])
    result = subprocess.run([sys.executable, "-c", FULL_DISK, "run", "--select", CASE, "--out", str(old),
                             "--replace", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "the run could not be stored (No space left on device: " in lines[0] and "as it was" in lines[0]
    assert [r.case_id for r in cli.load_run(old)[0]] == [OTHER]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_failing_summary_names_each_failing_case_once_worst_first_with_its_diagnosis():
    records = [rec(CASE, "fail", 3.0, diagnosis="lr-scale: the step is 1.2 x the reference's"),
               rec(CASE, "fail", 9.0, check="scale", diagnosis="lr-scale: the step is 1.2 x the reference's"),
               rec(OTHER, "error", math.nan, diagnosis="error: the target raised (see the message)"),
               rec("c3", "fail", 1.5, diagnosis=""),
               rec("c4", "pass", 0.5)]
    lines = cli.failing_summary(records, limit=2)
    assert lines[0] == "3 failing cases, by diagnosis: lr-scale 1, undiagnosed 1, error 1"
    assert lines[1].split() == ["lr-scale", CASE, "(scale", "fail,", "ratio", "9)"]
    assert lines[2].split() == ["undiagnosed", "c3", "(reference", "fail,", "ratio", "1.5)"]
    assert lines[3] == "  ... 1 more, with their diagnosis lines, in summary.md and report.html"
    assert len(lines) == 4


def test_a_run_with_nothing_failing_prints_no_failing_summary():
    assert cli.failing_summary([rec(CASE, "pass"), rec(OTHER, "skipped", math.nan)]) == []


def test_run_prints_the_failing_cases_with_their_diagnosis(tmp_path, capfd):
    """End to end: a wrong optimizer's run names its failing case and the diagnosis label on the console
    (capfd: the run enables faulthandler on stderr, which needs a file descriptor)."""
    code = cli.main(["run", "--target", "harness.apps.selftest_catalog:lr_rms_min", "--select", CASE,
                     "--out", str(tmp_path / "out"), "--quiet", "--allow-thin"])
    err = capfd.readouterr().err
    assert code == 1
    assert "1 failing cases, by diagnosis: lr-scale 1" in err, err
    assert re.search(rf"^  lr-scale +{re.escape(CASE)}  \(", err, re.M), err

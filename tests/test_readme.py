"""The README works as written: every fenced block in it is run here, exactly as it stands.

Each block is preceded by an HTML comment that says how it is tested:

  <!-- readme-test: ci -->                 .ci/run runs every command of the block verbatim
  <!-- readme-test: synopsis -->           every subcommand and option shown exists in the CLI
  <!-- readme-test: file NAME -->          a file the reader is told to create; it runs (exit 0)
  <!-- readme-test: run exit=N id=ID -->   run with bash in a fresh directory holding every `file`
                                           block; exit status N; then the checks of CHECKS[ID]

A block that needs GPUs (`needs-gpus=G`) runs all the same: with fewer than G visible every case
must come back `skipped` with the reason and exit N (the documented outcome); with G it must pass.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from harness.apps.cli import main as harness_main
from reports.derived import allowed
from reports.records import Record, read_csv

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
KINDS = ("ci", "synopsis", "file", "run")
ANNOTATION = re.compile(r"<!-- readme-test: (.*?) -->")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    kind: str
    args: tuple[str, ...]
    options: dict[str, str]

    @property
    def name(self) -> str:
        return self.options.get("id") or (self.args[0] if self.args else f"line{self.line}")


def blocks(text: str) -> list[Block]:
    """Every fenced block of `text` with the annotation on the nearest non-blank line above it
    (kind "" when there is none)."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, lang = i, lines[i][3:].strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        match = ANNOTATION.fullmatch(above.strip())
        words = shlex.split(match.group(1)) if match else []
        kind = words[0] if words else ""
        args = tuple(w for w in words[1:] if "=" not in w)
        options = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        found.append(Block(start + 1, lang, "\n".join(lines[start + 1:end]), kind, args, options))
        i = end + 1
    return found


BLOCKS = blocks(README.read_text())
FILES = {b.args[0]: b.body for b in BLOCKS if b.kind == "file"}
RUNS = [b for b in BLOCKS if b.kind == "run"]


def test_annotations_are_parsed_from_the_line_above_each_block():
    """The parser itself: an annotated block, an unannotated one, options and arguments."""
    text = "x\n<!-- readme-test: run exit=1 id=a -->\n\n```bash\necho hi\n```\n\n```\nplain\n```\n"
    first, second = blocks(text)
    assert (first.kind, first.options, first.body, first.lang) == ("run", {"exit": "1", "id": "a"}, "echo hi", "bash")
    assert (second.kind, second.body) == ("", "plain")


def test_every_block_is_covered():
    """No block escapes: each has a known kind, runs have an exit status and a check, ids are unique."""
    assert BLOCKS, "README has no code blocks?"
    for b in BLOCKS:
        assert b.kind in KINDS, f"README line {b.line}: block without a readme-test annotation of {KINDS}"
        if b.kind == "file":
            assert len(b.args) == 1 and b.lang == "python", f"README line {b.line}: `file NAME` on a python block"
        if b.kind == "run":
            assert "exit" in b.options and "id" in b.options, f"README line {b.line}: run needs exit= and id="
            assert b.lang == "bash", f"README line {b.line}: run blocks are bash"
    ids = [b.name for b in RUNS]
    assert len(ids) == len(set(ids)), f"duplicate run ids {ids}"
    assert set(ids) == set(CHECKS), f"run blocks {sorted(ids)} vs checks {sorted(CHECKS)}"
    assert sum(b.kind == "ci" for b in BLOCKS) == 1 and sum(b.kind == "synopsis" for b in BLOCKS) == 1


def commands(body: str) -> list[str]:
    """The commands of a shell block: non-blank, non-comment lines."""
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_ci_runs_the_set_up_commands_verbatim_within_the_constraints():
    """The two commands of "Set up and run" are lines of .ci/run as written, and every pip call there
    comes after PIP_CONSTRAINT names .ci/constraints.txt, which pins the CPU build of torch 2.13.0."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    (block,) = [b for b in BLOCKS if b.kind == "ci"]
    wanted = commands(block.body)
    assert len(wanted) == 2
    for command in wanted:
        assert command in ci, f".ci/run does not run {command!r} verbatim"
    constrain = next(i for i, line in enumerate(ci) if line.startswith("export PIP_CONSTRAINT="))
    assert ".ci/constraints.txt" in ci[constrain]
    pips = [i for i, line in enumerate(ci) if "pip install" in line]
    assert len(pips) >= 3 and min(pips) > constrain
    pins = commands((ROOT / ".ci" / "constraints.txt").read_text())
    assert "torch==2.13.0" in pins


def test_pyproject_accepts_a_range_of_torch():
    """Users keep the torch they train with: the project asks for a lower bound, not a pin."""
    text = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=2.11"' in text and "torch==" not in text


def test_synopsis_names_only_what_the_cli_has():
    """Every subcommand, option and listed choice of the synopsis appears in that subcommand's --help."""
    (block,) = [b for b in BLOCKS if b.kind == "synopsis"]
    subcommand = ""
    for line in block.body.splitlines():
        words = line.split()
        if words[:3] == ["python", "-m", "harness"]:
            subcommand = words[3]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            harness_main([subcommand, "--help"])
        assert exit_.value.code == 0
        help_text = out.getvalue()
        for option in re.findall(r"--[a-z-]+", line):
            assert option in help_text, f"synopsis shows {subcommand} {option}, which --help does not list"
        for choices in re.findall(r"--[a-z]+ ([a-z0-9]+(?:[|,][a-z0-9]+)+)", line):
            for choice in re.split(r"[|,]", choices):
                assert choice in help_text, f"synopsis lists {choice!r}, which {subcommand} --help does not"


def environment() -> dict[str, str]:
    """The reader's shell: this interpreter's `python` (and `torchrun`) first on PATH, the project
    importable (CI installs it with pip; here it is put on PYTHONPATH)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def reader_directory(tmp_path: Path) -> Path:
    """A fresh directory holding every file the README tells the reader to create."""
    for name, body in FILES.items():
        (tmp_path / name).write_text(body + "\n")
    return tmp_path


@pytest.mark.parametrize("name", sorted(FILES))
def test_file_block_runs(name: str, tmp_path: Path):
    proc = subprocess.run([sys.executable, name], cwd=reader_directory(tmp_path), env=environment(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def records(folder: Path) -> list[Record]:
    got = read_csv(folder / "results.csv")
    assert got, f"{folder} holds no records"
    return got


def worst_step(record: Record) -> int:
    match = re.search(r"worst at .*?step (\d+)", record.message)
    assert match, record.message
    return int(match.group(1))


def check_one_case(folder: Path, gpus: bool) -> None:
    got = records(folder / "out")
    assert {r.case_id for r in got} == {"muon/conv2d-8x4x3x3/mb3/flat/bf16@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"}
    assert all(r.status == "pass" for r in got)


ADAPTER_REASONS = ("MyMuon is Muon for 2-D parameters only", "MyMuon orthogonalizes with Newton-Schulz in fp32 only",
                   "MyMuon has one lr scale, sqrt(max(1, fan_out/fan_in))")


def check_mine(folder: Path, gpus: bool) -> None:
    """Every case the adapter accepts passes; every other one is unsupported with the adapter's reason."""
    got = records(folder / "out-mine")
    assert {r.status for r in got} <= {"pass", "unsupported"}
    assert sum(r.status == "pass" for r in got) > 0
    assert all(r.message in ADAPTER_REASONS for r in got if r.status == "unsupported")


def check_torch(folder: Path, gpus: bool) -> None:
    """The finding's pattern: every failure is a bf16 parameter without Nesterov, the step-by-step
    checks at step 2 or later; the bf16 Nesterov cases and every other supported case pass."""
    got = records(folder / "out-torch")
    failing = [r for r in got if r.failing]
    assert failing and all(r.status == "fail" for r in failing)
    for r in failing:
        assert r.param_dtype == "bf16" and "/plain/" in r.case_id, r
        assert r.check in ("norm", "spectrum", "probe", "rescale") or worst_step(r) >= 2, r  # bf16 checks judge all steps
    assert any(r.status == "pass" and r.param_dtype == "bf16" and "/nesterov/" in r.case_id for r in got)
    assert all(r.message for r in got if r.status == "unsupported")


def check_torch_one(folder: Path, gpus: bool) -> None:
    """The numbers the worked example quotes."""
    got = {(("plain" if "/plain/" in r.case_id else "nesterov"), r.check): r for r in records(folder / "out-torch-one")}
    plain = got[("plain", "reference")]
    assert plain.status == "fail" and f"{plain.rel_err:.2f}" == "0.18" and worst_step(plain) == 2
    assert "member 1 step 2" in plain.message
    nesterov = [r for (kind, _), r in got.items() if kind == "nesterov"]
    assert nesterov and all(r.status == "pass" for r in nesterov)
    assert f"{got[('nesterov', 'reference')].rel_err:.2g}" == "0.019"


def check_allowance(folder: Path, gpus: bool) -> None:
    """The numbers "Reading a failure" quotes for a passing bf16 row whose rel_err exceeds its rtol."""
    reference = next(r for r in records(folder / "out-allowance") if r.check == "reference")
    assert reference.status == "pass" and f"{reference.tolerance:.2g}" == "0.00029"
    assert [f"{v:.2g}" for v in (reference.rel_err, allowed(reference), reference.ratio)] == ["0.064", "0.13", "0.49"]
    assert "rel_err 0.0638 vs allowed 0.13 (rtol 0.000294797 + storage rounding)" in reference.message


def check_gloo(folder: Path, gpus: bool) -> None:
    got = records(folder / "out-gloo")
    assert all(r.status == "pass" and r.backend == "gloo" and r.world_size == 3 and r.layout == "shard0-uneven"
               for r in got)
    assert {r.check for r in got} >= {"reference", "local_shard", "layout"}


def gpu_block_checker(out: str) -> Callable[[Path, bool], None]:
    """Without the GPUs: every case skipped with the reason. With them: every check that ran passes."""

    def check(folder: Path, gpus: bool) -> None:
        got = records(folder / out)
        assert all(r.backend == "nccl" and r.world_size == 2 for r in got)
        if gpus:
            assert all(r.status in ("pass", "unsupported") for r in got) and any(r.status == "pass" for r in got)
            return
        for r in got:
            assert r.status == "skipped", r
            assert "no CUDA device visible" in r.message or "needs 2 GPUs" in r.message, r.message

    return check


def check_gpu_triton(folder: Path, gpus: bool) -> None:
    """Without a GPU every check is unsupported with the reason; with one, every check that ran passes."""
    got = records(folder / "out-gpu-triton")
    assert got and all(r.backend == "cuda" for r in got)
    if gpus:
        assert all(r.status in ("pass", "unsupported", "skipped") for r in got) and any(r.status == "pass" for r in got)
        return
    assert all(r.status == "unsupported" and "no CUDA device visible" in r.message for r in got), got


CHECKS: dict[str, Callable[[Path, bool], None]] = {
    "one-case": check_one_case,
    "mine": check_mine,
    "torch": check_torch,
    "torch-one": check_torch_one,
    "allowance": check_allowance,
    "gloo": check_gloo,
    "nccl": gpu_block_checker("out-nccl"),
    "torchrun": gpu_block_checker("out-torchrun"),
    "gpu-triton": check_gpu_triton,
}
"""What each run block's documented outcome is, beyond its exit status."""

@pytest.mark.parametrize("block", RUNS, ids=[b.name for b in RUNS])
def test_run_block(block: Block, tmp_path: Path):
    folder = reader_directory(tmp_path)
    gpus = "needs-gpus" in block.options and torch.cuda.device_count() >= int(block.options["needs-gpus"])
    proc = subprocess.run(["bash", "-c", "set -e\n" + block.body], cwd=folder, env=environment(),
                          capture_output=True, text=True, timeout=300)
    expected = 0 if gpus else int(block.options["exit"])
    assert proc.returncode == expected, f"README line {block.line}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    CHECKS[block.name](folder, gpus)

"""The documentation works as written: every fenced block of the README and of the docs pages (`PAGES`)
is run here, exactly as it stands.

Each block is preceded by an HTML comment that says how it is tested:

  <!-- readme-test: ci -->                 .ci/run runs every command of the block verbatim
  <!-- readme-test: synopsis -->           every subcommand and option shown exists in the CLI, and
                                           every one the CLI has is shown
  <!-- readme-test: file NAME -->          a file the reader is told to create; it runs (exit 0)
  <!-- readme-test: run exit=N id=ID -->   run with bash in a fresh directory holding every `file`
                                           block; exit status N; then the checks of CHECKS[ID]

A block that needs GPUs (`needs-gpus=G`) runs all the same: with fewer than G visible every case
must come back `skipped` with the reason and exit N (the documented outcome); with G it must pass.
Every page's relative links resolve (file and heading), and the README links every docs page.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from harness.apps.cli import COMMANDS
from harness.apps.cli import main as harness_main
from reports.derived import allowed
from reports.records import Record, read_csv

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NOT_RUN = {
    "docs/performance.md": "a lab record: each measurement's command on the GPU machine it ran on, and its output",
    "docs/multinode.md": "torchrun over several nodes, which no single machine can run",
}
"""Docs pages whose blocks are not run, and why; every other page of docs/ is in PAGES."""
PAGES = (README, *sorted(p for p in (ROOT / "docs").glob("*.md") if str(p.relative_to(ROOT)) not in NOT_RUN))
KINDS = ("ci", "synopsis", "file", "run")
ANNOTATION = re.compile(r"<!-- readme-test: (.*?) -->")
CPU_TORCH = "--index-url https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    body: str
    kind: str
    args: tuple[str, ...]
    options: dict[str, str]

    @property
    def name(self) -> str:
        return self.options.get("id") or (self.args[0] if self.args else f"line{self.line}")

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def blocks(text: str, page: str = "") -> list[Block]:
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
        found.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:end]), kind, args, options))
        i = end + 1
    return found


TEXT = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
BLOCKS = [b for page, text in TEXT.items() for b in blocks(text, page)]
FILES = {b.args[0]: b.body for b in BLOCKS if b.kind == "file"}
RUNS = [b for b in BLOCKS if b.kind == "run"]


def test_annotations_are_parsed_from_the_line_above_each_block():
    """The parser itself: an annotated block, an unannotated one, options and arguments."""
    text = "x\n<!-- readme-test: run exit=1 id=a -->\n\n```bash\necho hi\n```\n\n```\nplain\n```\n"
    first, second = blocks(text, "p.md")
    assert (first.kind, first.options, first.body, first.lang) == ("run", {"exit": "1", "id": "a"}, "echo hi", "bash")
    assert (second.kind, second.body, second.where) == ("", "plain", "p.md line 8")


def test_every_page_is_run_or_excluded_with_a_reason():
    """The pages run are the README and docs/*.md but those of NOT_RUN, which exist."""
    for page in NOT_RUN:
        assert (ROOT / page).is_file(), f"NOT_RUN names {page}, which does not exist"
    assert {"README.md", "docs/commands.md", "docs/distributed.md"} <= set(TEXT)


def test_every_block_is_covered():
    """No block escapes: each has a known kind, runs have an exit status and a check, ids and file names
    are unique."""
    assert RUNS, "no run blocks?"
    for b in BLOCKS:
        assert b.kind in KINDS, f"{b.where}: block without a readme-test annotation of {KINDS}"
        if b.kind == "file":
            assert len(b.args) == 1 and b.lang == "python", f"{b.where}: `file NAME` on a python block"
        if b.kind == "run":
            assert "exit" in b.options and "id" in b.options, f"{b.where}: run needs exit= and id="
            assert b.lang == "bash", f"{b.where}: run blocks are bash"
    ids = [b.name for b in RUNS]
    assert len(ids) == len(set(ids)), f"duplicate run ids {ids}"
    assert set(ids) == set(CHECKS), f"run blocks {sorted(ids)} vs checks {sorted(CHECKS)}"
    names = [b.args[0] for b in BLOCKS if b.kind == "file"]
    assert len(names) == len(set(names)), f"a file block's name repeats: {names}"
    assert sum(b.kind == "synopsis" for b in BLOCKS) == 1
    assert [b.page for b in BLOCKS if b.kind == "ci"][0] == "README.md", "the README's first ci block is its install"


def commands(body: str) -> list[str]:
    """The commands of a shell block: non-blank, non-comment lines."""
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]


def install_problems(lines: list[str]) -> list[str]:
    """What keeps an install block from working when copied as is on a CPU machine: it must make and
    enter a virtual environment, then install the CPU build of torch, then the project with its test
    extra (the project first would pull torch's CUDA build)."""
    def first(predicate: Callable[[str], bool]) -> int | None:
        return next((i for i, line in enumerate(lines) if predicate(line)), None)

    venv = first(lambda line: "-m venv" in line and "activate" in line)
    torch_cpu = first(lambda line: "pip install torch " in line and CPU_TORCH in line)
    project = first(lambda line: "pip install -e '.[test]'" in line)
    problems = []
    if venv is None:
        problems.append("no virtual environment made and activated")
    if torch_cpu is None:
        problems.append(f"torch is not installed from the CPU index ({CPU_TORCH})")
    if project is None:
        problems.append("the project is not installed with its test extra")
    if None not in (venv, torch_cpu, project) and not venv < torch_cpu < project:
        problems.append("the order must be: virtual environment, CPU torch, the project")
    return problems


def test_install_problems_flags_a_block_that_would_not_work_on_a_cpu_machine():
    """The negative controls of the install check: each broken block is flagged."""
    good = ["python3 -m venv .venv && . .venv/bin/activate", f"python -m pip install torch {CPU_TORCH}",
            "python -m pip install -e '.[test]'"]
    assert install_problems(good) == []
    assert install_problems([good[0], good[2]]) == [f"torch is not installed from the CPU index ({CPU_TORCH})"]
    assert install_problems([good[0], good[2], good[1]]) == ["the order must be: virtual environment, CPU torch, the project"]
    assert install_problems(good[1:]) == ["no virtual environment made and activated"]


def test_ci_runs_the_documented_commands_verbatim_within_the_constraints():
    """Every command of every `ci` block is a line of .ci/run as written, in the block's order; the README's
    install block works as is on a CPU machine; every pip call of .ci/run comes after PIP_CONSTRAINT names
    .ci/constraints.txt, which pins the CPU build of torch 2.13.0."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_blocks = [b for b in BLOCKS if b.kind == "ci"]
    for block in ci_blocks:
        wanted = commands(block.body)
        assert wanted, f"{block.where}: an empty ci block"
        for command in wanted:
            assert command in ci, f".ci/run does not run {command!r} ({block.where}) verbatim"
        at = [ci.index(command) for command in wanted]
        assert at == sorted(at), f".ci/run runs the commands of {block.where} out of order"
    assert install_problems(commands(ci_blocks[0].body)) == []
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


def harness_help(subcommand: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        harness_main([subcommand, "--help"])
    assert exit_.value.code == 0
    return out.getvalue()


def plugin_help(tmp_path: Path) -> str:
    """The pytest plugin's options as `pytest --help` prints them (run away from this repository's conftest)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "--help"], cwd=tmp_path,
                          env=environment(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def synopsis_problems(body: str, helps: dict[str, str]) -> list[str]:
    """How a synopsis and the --help texts disagree: a subcommand, option or listed choice shown that its
    help lacks, or a subcommand or option of the help not shown. `helps` maps each subcommand (and
    "pytest", whose own options are the `--muon-*` ones) to its help text."""
    shown: dict[str, set[str]] = {}
    problems, command = [], ""
    for line in body.splitlines():
        words = line.split()
        if words[:3] == ["python", "-m", "harness"]:
            command = words[3]
        elif words[:1] == ["pytest"]:
            command = "pytest"
        if command not in helps:
            problems.append(f"synopsis shows {command!r}, which is no command")
            continue
        options = set(re.findall(r"--[a-z][a-z-]*[a-z]", line))
        shown.setdefault(command, set()).update(options)
        problems += [f"synopsis shows {command} {o}, which --help does not list" for o in sorted(options)
                     if o not in helps[command]]
        for choices in re.findall(r"--[a-z-]+[ =]([a-z0-9]+(?:[|,][a-z0-9]+)+)", line):
            problems += [f"synopsis lists {c!r} for {command}, which its --help does not" for c in re.split(r"[|,]", choices)
                         if c not in helps[command]]
    for command, text in helps.items():
        own = {o for o in re.findall(r"--[a-z][a-z-]*[a-z]", text) if o != "--help"}
        if command == "pytest":
            own = {o for o in own if o.startswith("--muon-")}
        if command not in shown:
            problems.append(f"synopsis leaves out {command}")
        elif missing := sorted(own - shown[command]):
            problems.append(f"synopsis leaves out {command} {' '.join(missing)}")
    return problems


@pytest.fixture(scope="module")
def helps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {**{name: harness_help(name) for name in COMMANDS}, "pytest": plugin_help(tmp_path_factory.mktemp("help"))}


def test_synopsis_shows_exactly_what_the_cli_has(helps: dict[str, str]):
    """The synopsis of docs/commands.md against every subcommand's --help and the plugin's options."""
    (block,) = [b for b in BLOCKS if b.kind == "synopsis"]
    assert synopsis_problems(block.body, helps) == []


def test_synopsis_problems_flags_options_shown_wrongly_or_left_out(helps: dict[str, str]):
    """The negative controls: an option the CLI lacks, a wrong choice, a left-out option and a left-out command."""
    (block,) = [b for b in BLOCKS if b.kind == "synopsis"]
    invented = block.body.replace("[--quiet]", "[--quiet] [--colour]")
    assert synopsis_problems(invented, helps) == ["synopsis shows run --colour, which --help does not list"]
    wrong_choice = block.body.replace("--tier ci|nightly|gpu] [--select SUBSTRING ...] [--target TARGET]",
                                      "--tier ci|weekly] [--select SUBSTRING ...] [--target TARGET]")
    assert synopsis_problems(wrong_choice, helps) == ["synopsis lists 'weekly' for list, which its --help does not"]
    assert synopsis_problems(block.body.replace(" [--isolate]", ""), helps) == ["synopsis leaves out run --isolate"]
    no_selftest = "\n".join(line for line in block.body.splitlines() if "harness selftest" not in line)
    assert synopsis_problems(no_selftest, helps) == ["synopsis leaves out selftest"]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(page: Path, text: str) -> list[str]:
    """The relative links of `text` (a page at `page`) whose file or heading does not exist."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", file.read_text(), flags=re.M)
            if fragment not in {anchor(h) for h in headings}:
                broken.append(target)
    return broken


@pytest.mark.parametrize("page", sorted(TEXT))
def test_links_resolve(page: str):
    assert broken_links(ROOT / page, TEXT[page]) == []


def test_broken_links_are_flagged():
    """The negative controls: a missing file and a missing heading; a good link, a web link and an
    in-page anchor pass."""
    text = ("[a](docs/commands.md#exit-status) [b](https://example.org/x) [c](#more) [d](docs/nowhere.md) "
            "[e](docs/commands.md#no-such-heading)")
    assert broken_links(README, text) == ["docs/nowhere.md", "docs/commands.md#no-such-heading"]
    assert anchor("Worked example: PyTorch's `torch.optim.Muon`") == "worked-example-pytorchs-torchoptimmuon"


def unlinked(readme: str, pages: Iterable[str]) -> list[str]:
    """The docs pages (paths relative to the root) that `readme` does not link."""
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    return sorted(p for p in pages if p not in linked)


def test_the_readme_links_every_docs_page():
    pages = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")]
    assert pages and unlinked(TEXT["README.md"], pages) == []
    assert unlinked("[x](docs/commands.md)", ["docs/commands.md", "docs/peers.md"]) == ["docs/peers.md"]


def quoted_counts_missing(texts: dict[str, str], counts: dict[str, int]) -> list[str]:
    """The case counts the pages quote that do not match the tiers: each phrase of `QUOTED_COUNTS`, filled
    with `counts`, must appear in its page (whitespace as Markdown folds it)."""
    missing = []
    for page, phrases in QUOTED_COUNTS.items():
        flat = " ".join(texts[page].split())
        missing += [f"{page}: {p.format(**counts)!r}" for p in phrases if p.format(**counts) not in flat]
    return missing


QUOTED_COUNTS = {
    "README.md": ("821 of the {ci} cases of our CI tier are beyond MyMuon ({ci_distributed} distributed",),
    "docs/distributed.md": ("({ci_distributed} cases today, {ci_tp} of them tensor-parallel",
                            "The CI tier holds {ci_tp} TP cases"),
}
"""Phrases that quote how many cases the CI tier holds, by page (821, MyMuon's unsupported count, is the scope
line's, checked by its run block)."""


def case_counts() -> dict[str, int]:
    from cases import tier

    ci = tier("ci")
    distributed = [c for c in ci if c.world_size > 1]
    return {"ci": len(ci), "ci_distributed": len(distributed),
            "ci_tp": sum("tp" in c.id.split("/")[-2] for c in distributed)}


def test_quoted_case_counts_are_the_tiers():
    counts = case_counts()
    assert quoted_counts_missing(TEXT, counts) == []
    grown = {**counts, "ci_tp": counts["ci_tp"] + 1}  # the negative control: a tier that changed
    assert quoted_counts_missing(TEXT, grown) == [
        f"docs/distributed.md: '({counts['ci_distributed']} cases today, {grown['ci_tp']} of them tensor-parallel'",
        f"docs/distributed.md: 'The CI tier holds {grown['ci_tp']} TP cases'"]


def environment() -> dict[str, str]:
    """The reader's shell: this interpreter's `python` (and `torchrun`) first on PATH, the project
    importable (CI installs it with pip; here it is put on PYTHONPATH), and a git identity to commit with."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for role in ("AUTHOR", "COMMITTER"):
        env.setdefault(f"GIT_{role}_NAME", "optimizer author")
        env.setdefault(f"GIT_{role}_EMAIL", "author@example.invalid")
    return env


def reader_directory(tmp_path: Path) -> Path:
    """A fresh directory holding every file the pages tell the reader to create."""
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


def run_json(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


def worst_step(record: Record) -> int:
    match = re.search(r"worst at .*?step (\d+)", record.message)
    assert match, record.message
    return int(match.group(1))


ADAPTER_REASONS = ("MyMuon is Muon for 2-D parameters only", "MyMuon orthogonalizes with Newton-Schulz in fp32 only",
                   "MyMuon has one lr scale, sqrt(max(1, fan_out/fan_in))")


def check_adapter_run(folder: Path) -> None:
    """Every case the adapter accepts passes, any other is unsupported with the adapter's reason (and the
    `mixed` check skipped with it: MyMuon refuses the convolutions a Linear's group would hold), and the
    scope line is the one the README quotes."""
    got = records(folder)
    assert {r.status for r in got} <= {"pass", "unsupported", "skipped"}
    assert sum(r.status == "pass" for r in got) > 0
    assert all(r.message in ADAPTER_REASONS for r in got if r.status == "unsupported")
    assert all(r.check == "mixed" and r.message.endswith(ADAPTER_REASONS[0]) for r in got if r.status == "skipped")
    scope = run_json(folder)["scope"]
    assert scope and f"    {scope}\n" in TEXT["README.md"], f"the README does not quote this scope line: {scope}"


def check_mine(folder: Path, gpus: bool) -> None:
    check_adapter_run(folder / "out-mine")
    assert run_json(folder / "out-mine")["thin"] == ""


def check_plugin(folder: Path, gpus: bool) -> None:
    """The plugin's stored run judges as `run` does and says it came from pytest."""
    check_adapter_run(folder / "out-plugin")
    assert run_json(folder / "out-plugin")["command"].startswith("pytest --muon-target=my_targets:target")


def check_pr_diff(folder: Path, gpus: bool) -> None:
    """The regression the README describes: REGRESSED, the number of new failures it quotes, each side's
    run judging its own commit of my_targets."""
    out = folder / "pr-diff"
    markdown = (out / "diff.md").read_text()
    assert markdown.startswith("# REGRESSED"), markdown[:200]
    counted = re.search(r"^\| new failures \| (\d+) \|", markdown, flags=re.M)
    quoted = re.search(r"with (\d+) new failures", TEXT["README.md"])
    assert counted and quoted and counted.group(1) == quoted.group(1), (counted, quoted)
    judged = [run_json(out / side)["judged"] for side in ("base-run", "head-run")]
    assert [j["module"] for j in judged] == ["my_targets", "my_targets"]
    assert judged[0]["commit"] and judged[1]["commit"] and judged[0]["commit"] != judged[1]["commit"]
    assert (out / "diff.html").is_file()


def check_torch(folder: Path, gpus: bool) -> None:
    """The findings' patterns: every failure is either the bf16 momentum buffer's (a bf16 parameter without
    Nesterov, the step-by-step checks at step 2 or later) or the normaliser's overflow (extreme gradients, the
    update lost: `reference`); the bf16 Nesterov cases and every other supported case pass."""
    got = records(folder / "out-torch")
    failing = [r for r in got if r.failing]
    assert failing and all(r.status == "fail" for r in failing)
    overflow = [r for r in failing if r.grad == "extreme"]
    assert overflow and all(r.check == "reference" for r in overflow), overflow
    for r in failing:
        if r.grad == "extreme":
            continue
        assert r.param_dtype == "bf16" and "/plain" in r.case_id, r
        assert r.check in ("norm", "spectrum", "probe", "rescale") or worst_step(r) >= 2, r  # bf16 checks judge all steps
    assert any(r.status == "pass" and r.param_dtype == "bf16" and "/nesterov" in r.case_id for r in got)
    assert all(r.message for r in got if r.status == "unsupported")


def check_torch_one(folder: Path, gpus: bool) -> None:
    """The numbers and the diagnosis the README's failure example quotes."""
    got = {(("plain" if "/plain/" in r.case_id else "nesterov"), r.check): r for r in records(folder / "out-torch-one")}
    plain = got[("plain", "reference")]
    assert plain.status == "fail" and f"{plain.rel_err:.2f}" == "0.18" and worst_step(plain) == 2
    assert "member 1 step 2" in plain.message
    assert f"    {plain.diagnosis}\n" in TEXT["README.md"], f"the README does not quote the diagnosis {plain.diagnosis!r}"
    nesterov = [r for (kind, _), r in got.items() if kind == "nesterov"]
    assert nesterov and all(r.status == "pass" for r in nesterov)
    assert f"{got[('nesterov', 'reference')].rel_err:.2g}" == "0.019"


def check_allowance(folder: Path, gpus: bool) -> None:
    """The numbers docs/tolerances.md quotes for a passing bf16 row whose rel_err exceeds its rtol."""
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
    "mine": check_mine,
    "plugin": check_plugin,
    "pr-diff": check_pr_diff,
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
    assert proc.returncode == expected, f"{block.where}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    CHECKS[block.name](folder, gpus)

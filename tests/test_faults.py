"""Faults lose nothing and hang nothing (issue 30, items 1, 4, 5, 6): targets that crash, exit, hang,
modify their inputs or change torch's global settings, written here as a module (`faulty_targets`)
and loaded with --target faulty_targets:NAME, as a user's adapter would be.

Each fault is judged on the case it happened in, and the run goes on: a dead or hung worker is an
error on its case; a run stopped by SIGTERM writes what finished and leaves no process behind; a run
whose own process dies still stores what finished; a target that wrote into its inputs is one error
saying so; settings a target changed are restored and named."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from cases import Case
from harness import runner
from harness.running import guard, workers
from harness.running.inputs import make_inputs
from harness.targets import load_target
from reports import load_run

ROOT = Path(__file__).resolve().parent.parent
FIRST = "muon/linear-12x20/mb2/noflat/fp32@bf16/ns/rms_norm/plain/wd0/steps3/gaussian/seed0"
EXITS = "muon/linear-12x20/mb2/noflat/fp32@bf16/pe/rms_norm/plain/wd0/steps3/gaussian/seed0"
SEGFAULTS = "muon/linear-12x20/mb2/noflat/fp32@bf16/gns/spectral_norm/nesterov/wd0.1/steps1/gaussian/seed0"
CASES = (FIRST, EXITS, SEGFAULTS)
SELECTS = tuple(arg for case in CASES for arg in ("--select", case))
DIST_FIRST = "muon/linear-12x20/mb1/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0/replicated/ws2"
DIST_NEXT = "muon/linear-12x20/mb2/noflat/bf16@bf16/ns/rms_norm/nesterov/wd0.1/steps1/zero/seed0/shard1/ws2"
"""The single-process cases the runs select, in run order (the tier's): the faults strike the second and the third."""
FINE = {"pass", "skipped"}
"""The statuses of a case our Muon steps without a fault (a check may not apply to it)."""

FAULTY_TARGETS = f'''
"""Our Muon behind adapters that misbehave on chosen cases."""
import os
import signal
import sys
import time

import torch

from harness.targets.ours import OursMuon

FIRST, EXITS, SEGFAULTS = {FIRST!r}, {EXITS!r}, {SEGFAULTS!r}
DIST_FIRST = {DIST_FIRST!r}


class Crashes(OursMuon):
    """os._exit(3) on EXITS, SIGSEGV on SEGFAULTS, each after a line of output."""

    name = "crashes"

    def run(self, params, grads, case):
        if case.id == EXITS:
            print("last words before os._exit(3)", flush=True)
            os._exit(3)
        if case.id == SEGFAULTS:
            print("last words before SIGSEGV", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(params, grads, case)


class SysExits(OursMuon):
    """sys.exit(3) on EXITS: an exception Python can catch."""

    name = "sys-exits"

    def run(self, params, grads, case):
        if case.id == EXITS:
            sys.exit(3)
        return super().run(params, grads, case)


def sleep_for_ever():
    while True:
        time.sleep(1)


class Hangs(OursMuon):
    """Never returns on EXITS."""

    name = "hangs"

    def run(self, params, grads, case):
        if case.id == EXITS:
            print("hanging in the target", flush=True)
            sleep_for_ever()
        return super().run(params, grads, case)


class NoClone(OursMuon):
    """The adapter mistake: torch.nn.Parameter(p) shares p's storage, so the steps write into the inputs."""

    name = "no-clone"

    def run(self, params, grads, case):
        live = [torch.nn.Parameter(p) for p in params]
        optimizer = self.make(live, case)
        out = []
        for step in grads:
            for p, g in zip(live, step):
                p.grad = g
            optimizer.step()
            out.append([p.detach().clone() for p in live])
        return out


def found():
    return torch.get_num_threads(), torch.get_float32_matmul_precision(), torch.get_rng_state()


def same(a, b):
    return a[:2] == b[:2] and torch.equal(a[2], b[2])


class Leaky(OursMuon):
    """Changes torch's threads, matmul precision and RNG after stepping FIRST; raises on any other case
    that finds them otherwise than FIRST did."""

    name = "leaky"
    first = None

    def run(self, params, grads, case):
        if case.id == FIRST and self.first is None:
            self.first = found()
        if case.id != FIRST and not same(found(), self.first):
            raise RuntimeError(f"FIRST's settings leaked into this case: {{found()[:2]}}, not {{self.first[:2]}}")
        out = super().run(params, grads, case)
        if case.id == FIRST:
            torch.set_num_threads(2)
            torch.set_float32_matmul_precision("medium")
            torch.manual_seed(1234)
        return out


class LeakyRanks(OursMuon):
    """Changes threads and matmul precision once it has built DIST_FIRST's optimizer (in every process: each
    rank, and the driver's single-process reruns); raises when it builds another case's and finds them
    otherwise than DIST_FIRST did."""

    name = "leaky-ranks"
    first = None

    def make_distributed(self, params, case, mesh):
        if case.id == DIST_FIRST and self.first is None:
            self.first = found()
        if case.id != DIST_FIRST and not same(found(), self.first):
            raise RuntimeError(f"DIST_FIRST's settings leaked into this case: {{found()[:2]}}, not {{self.first[:2]}}")
        optimizer = super().make_distributed(params, case, mesh)
        if case.id == DIST_FIRST:
            torch.set_num_threads(2)
            torch.set_float32_matmul_precision("medium")
        return optimizer


def crashes():
    return Crashes()


def leaky_ranks():
    return LeakyRanks()


def sys_exits():
    return SysExits()


def hangs():
    return Hangs()


def no_clone():
    return NoClone()


def leaky():
    return Leaky()
'''


@pytest.fixture(scope="module")
def targets_dir(tmp_path_factory) -> Path:
    """A directory holding faulty_targets.py."""
    root = tmp_path_factory.mktemp("faulty")
    (root / "faulty_targets.py").write_text(textwrap.dedent(FAULTY_TARGETS))
    return root


@pytest.fixture
def faulty(targets_dir, monkeypatch) -> Path:
    """faulty_targets importable here and in the workers this process spawns (they copy sys.path)."""
    monkeypatch.syspath_prepend(str(targets_dir))
    return targets_dir


def _cases(*ids: str) -> list[Case]:
    return [Case.from_id(i) for i in ids]


def _by_case(records) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r.case_id, []).append(r)
    return out


def _harness(targets_dir: Path, tmp: Path, *args: str, **popen) -> subprocess.Popen:
    """`python -m harness run ARGS` with faulty_targets importable and TMPDIR `tmp`."""
    env = {**os.environ, "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(targets_dir)])}
    return subprocess.Popen([sys.executable, "-m", "harness", "run", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    """The `pids` still running (zombies count as gone)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:g}s for {what}"
        time.sleep(0.1)


# --- item 1: workers that die, runs that stop, a process that dies --------------------------------------


def _task(clock: workers.Clock, kind: str) -> str:
    """A worker task for the Workers tests: misbehaves as `kind` says."""
    if kind == "slow-harness":  # past the timeout, but off the clock: the harness's own time
        time.sleep(4)
    elif kind == "hang":
        with clock.running():
            print("hanging on the clock", flush=True)
            time.sleep(600)
    elif kind == "sys.exit":
        sys.exit(5)
    elif kind == "os._exit":
        print("exiting with 3", flush=True)
        os._exit(3)
    return kind


def test_workers_fail_a_task_that_raises_dies_or_hangs_and_go_on():
    tasks = [("slow-harness",), ("hang",), ("sys.exit",), ("os._exit",), ("fine",)]
    with workers.Workers(1, timeout=2) as pool:
        outcomes = dict(pool.map(_task, tasks))
        pids = set(pool.pids)
    assert outcomes[0] == workers.Done("slow-harness"), "the timeout clocks the target's code only"
    assert outcomes[4] == workers.Done("fine"), "the worker was replaced and the run went on"
    hung, exited, died = outcomes[1], outcomes[2], outcomes[3]
    assert isinstance(hung, workers.Failed) and "ran past the timeout of 2s" in hung.why
    assert "hanging on the clock" in hung.why and re.search(r"File .*test_faults.py.*in _task", hung.why), hung.why
    assert isinstance(exited, workers.Failed) and "SystemExit: 5" in exited.why
    assert isinstance(died, workers.Failed) and "died (exit code 3) while the harness judged it" in died.why
    assert "exiting with 3" in died.why
    _wait(lambda: not _alive(pids), 10, "the workers to exit")


def test_a_jobs_run_records_a_dead_worker_on_its_case_and_goes_on(faulty, tmp_path):
    """`run --jobs 2` with a target that calls os._exit(3) on one case and segfaults on another: both cases are
    errors with the exit status and the last output, the run ends, and the first case passes (before issue 30:
    the run hung at [1/3] for ever)."""
    proc = _harness(faulty, tmp_path, *SELECTS, "--backend", "cpu", "--jobs", "2", "--target",
                    "faulty_targets:crashes", "--out", str(tmp_path / "out"), "--quiet")
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 1, stderr
    records, context = load_run(tmp_path / "out")
    assert context["complete"], context
    cases = _by_case(records)
    assert set(cases) == set(CASES)
    assert {r.status for r in cases[FIRST]} <= FINE
    for case_id, how, words in ((EXITS, "died (exit code 3) while the target's code ran", "before os._exit(3)"),
                                (SEGFAULTS, "died with signal SIGSEGV (exit code -11) while the target's code ran",
                                 "before SIGSEGV")):
        assert {r.status for r in cases[case_id]} == {"error"}
        message = cases[case_id][0].message
        assert how in message and f"last words {words}" in message, message
    assert "Fatal Python error: Segmentation fault" in cases[SEGFAULTS][0].message
    assert not list((tmp_path).glob("caseworkers-*")), "the workers' logs are removed"


def test_isolate_and_timeout_end_a_hung_single_process_case_with_its_stack(faulty):
    """Single-process: `timeout` alone runs the cases in a worker (as isolate does); the hung case is an error
    with the target's stack, and the cases after it run (before issue 30: no timeout, the run hung)."""
    target = load_target("faulty_targets:hangs")
    records = runner.run(_cases(*CASES), target, "faulty_targets:hangs", progress=None, timeout=20)
    cases = _by_case(records)
    assert {r.status for r in cases[FIRST] + cases[SEGFAULTS]} <= FINE
    assert {r.status for r in cases[EXITS]} == {"error"}
    message = cases[EXITS][0].message
    assert "the target's code ran past the timeout of 20s" in message and "hanging in the target" in message
    assert re.search(r"File .*faulty_targets.py.*in sleep_for_ever", message), message


def test_a_catchable_exit_in_the_target_is_its_cases_error(faulty):
    """sys.exit() in a target judged in this process is that case's error; the run goes on (before: the run
    ended with exit 3 and nothing written)."""
    target = load_target("faulty_targets:sys_exits")
    cases = _by_case(runner.run(_cases(*CASES), target, "faulty_targets:sys_exits", progress=None))
    assert {r.status for r in cases[EXITS]} == {"error"} and "SystemExit: 3" in cases[EXITS][0].message
    assert {r.status for r in cases[FIRST] + cases[SEGFAULTS]} <= FINE


def test_a_run_whose_own_process_dies_stores_what_finished_and_names_the_case(faulty, tmp_path):
    """Without --isolate the target's os._exit(3) ends the harness process (its status is the run's), and the
    journal's watcher stores the finished case and the case it died in, marked incomplete (before: an empty
    --out and no case named)."""
    proc = _harness(faulty, tmp_path, *SELECTS, "--backend", "cpu", "--target", "faulty_targets:crashes",
                    "--out", str(tmp_path / "out"), "--quiet")
    _, stderr = proc.communicate(timeout=900)  # the watcher holds stderr until it has stored the run
    assert proc.returncode == 3, stderr
    assert f"the harness process died while judging {EXITS}" in stderr, stderr
    records, context = load_run(tmp_path / "out")
    assert not context["complete"] and f"died while judging {EXITS}" in context["interrupted"], context
    cases = _by_case(records)
    assert set(cases) == {FIRST, EXITS}
    assert {r.status for r in cases[FIRST]} <= FINE
    assert {(r.status, r.message) for r in cases[EXITS]} == {("error", runner.DIED_HERE)}
    assert not list(tmp_path.glob("harness-journal-*")), "the watcher removes the journal"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_to_the_process_group_writes_what_finished_and_leaves_no_process(faulty, tmp_path):
    """`run --jobs 2` while one case hangs, then SIGTERM to the whole process group (what `timeout` and a CI
    cancel send): exit 143, the finished cases stored and marked incomplete, every worker and the journal's
    watcher gone (before: still running 10 minutes later; a second SIGTERM lost everything and left workers)."""
    proc = _harness(faulty, tmp_path, *SELECTS, "--backend", "cpu", "--jobs", "2", "--target",
                    "faulty_targets:hangs", "--out", str(tmp_path / "out"), start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    seen = []
    deadline = time.monotonic() + 600
    while True:  # a status line with a finished case: the third case has run, the second hangs
        assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
        try:
            seen.append(lines.get(timeout=1))
        except queue.Empty:
            continue
        status = re.match(r"\[\s*(\d+)/\s*3\]", seen[-1])
        if status and int(status.group(1)) == 2:
            break
    below = _descendants(proc.pid)
    assert len(below) >= 3, "two workers and the journal's watcher"
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    reader.join(timeout=30)
    rest = "".join(seen) + "".join(lines.get() for _ in range(lines.qsize()))
    assert "interrupted by SIGTERM after 2 of 3 cases" in rest and "Traceback" not in rest, rest
    _wait(lambda: not _alive(below), 10, f"processes {_alive(below)} to exit")
    records, context = load_run(tmp_path / "out")
    assert not context["complete"] and context["interrupted"] == "SIGTERM after 2 of 3 cases"
    assert set(_by_case(records)) == {FIRST, SEGFAULTS}


# --- item 4: a target that modifies its inputs ----------------------------------------------------------


def test_a_target_that_modifies_its_inputs_is_one_error_saying_so(faulty):
    """torch.nn.Parameter(p) without a clone steps the harness's inputs: every check of every case is an error
    naming that cause (before: fails blamed on lr-scale and members-mixed, passes on the rest)."""
    target = load_target("faulty_targets:no_clone")
    records = runner.run(_cases(FIRST, EXITS), target, "faulty_targets:no_clone", progress=None)
    assert records and {r.status for r in records} == {"error"}
    assert all(r.message.startswith("the target modified its inputs (parameter 0, parameter 1 changed in place)")
               for r in records), records[0].message
    ours = runner.run(_cases(FIRST, EXITS), load_target("ours"), "ours", progress=None)  # the negative control
    assert {r.status for r in ours} <= FINE and not any("modified its inputs" in r.message for r in ours)


def test_modified_compares_every_input_bit_for_bit():
    inputs = make_inputs(Case.from_id(FIRST))
    before = guard.copy_of(inputs)
    assert guard.modified(inputs, before) is None
    g = inputs.grads[2][1]
    g.view(torch.uint8)[0, 0] ^= 1  # the last bit of one element of one gradient
    assert "(gradient 1 of step 2 changed in place)" in guard.modified(inputs, before)
    g.copy_(before[-1])
    assert guard.modified(inputs, before) is None
    nan = torch.tensor([float("nan"), 1.0])
    assert guard._same_bits(nan, nan.clone()), "a NaN equals itself bit for bit"
    assert not guard._same_bits(nan, -nan), "but not a NaN of another sign"


# --- item 5: torch's global settings ----------------------------------------------------------------------


def test_settings_a_target_changes_are_restored_after_its_case_and_named(faulty):
    """Leaky changes threads, matmul precision and the RNG after stepping FIRST; the next case finds them as
    they were (before: it found 2 threads and "medium", and raised), and FIRST's records name the change."""
    target = load_target("faulty_targets:leaky")
    torch.set_num_threads(1)  # as `run` sets it before its cases
    before = guard.TorchState.capture()
    cases = _by_case(runner.run(_cases(FIRST, EXITS), target, "faulty_targets:leaky", progress=None))
    assert {r.status for r in cases[EXITS]} <= FINE, cases[EXITS][0].message
    for r in cases[FIRST]:
        assert "the target changed torch's global settings, restored after this case" in r.message
        assert "torch.get_num_threads(): 1 -> 2" in r.message  # `run` judges with one thread
        assert "torch.get_float32_matmul_precision(): highest -> medium" in r.message
    assert not any("changed torch's global settings" in r.message for r in cases[EXITS])
    assert guard.TorchState.capture().changes(before) == []


def test_kept_torch_state_restores_every_setting_and_names_what_changed():
    before = guard.TorchState.capture()
    with guard.kept_torch_state() as changed:
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_grad_enabled(False)
        torch.randn(3)
    assert changed == ["torch.get_default_dtype(): torch.float32 -> torch.float64",
                       "torch.are_deterministic_algorithms_enabled(), warn_only: (False, False) -> (True, True)",
                       "torch.is_grad_enabled(): True -> False"]
    after = guard.TorchState.capture()
    assert after.changes(before) == [] and torch.equal(after.cpu_rng, before.cpu_rng)
    with guard.kept_torch_state() as changed:
        torch.randn(3)  # drawing random numbers is use, not a setting: restored without a word
    assert changed == [] and torch.equal(torch.get_rng_state(), before.cpu_rng)


def test_the_ranks_restore_the_settings_a_target_changed_and_its_records_name_them(faulty):
    """On a rank pool, which runs case after case: LeakyRanks's settings from DIST_FIRST do not reach DIST_NEXT
    (before: the ranks raised on DIST_NEXT), and DIST_FIRST's records name them."""
    target, spec = load_target("faulty_targets:leaky_ranks"), "faulty_targets:leaky_ranks"
    first = runner.run_case(Case.from_id(DIST_FIRST), target, spec)
    after = runner.run_case(Case.from_id(DIST_NEXT), target, spec)
    assert first and all(re.search(r"torch.get_num_threads\(\): \d+ -> 2", r.message) for r in first), first[0].message
    assert {r.status for r in after} <= FINE, after[0].message
    assert not any("changed torch's global settings" in r.message for r in after)

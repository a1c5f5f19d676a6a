"""A mutation session: a directory that holds everything a run needs to resume.

  mutants.json   the mutants of each module, with the hash of the source they were made from
  reach.json     the coverage map (reach.py), remade when a source it depends on changes
  results.jsonl  one verdict per judged mutant, appended as each ends: a stopped run loses nothing
  logs/          each judge's output
  scratch-N/     worker N's copy of the project

A run judges, module by module in the order asked, every mutant without a verdict yet, `jobs`
at a time, until the budget is spent (the judges running then finish). A module whose source
changed since its mutants were made is refused: a session judges one state of the code.
Each mutant's judges run in the order the map gives them, but for those that killed the module's
mutants before, which go first (`Session.killers`, `selection.killers_first`): the same judges, reached sooner.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from benchmarks.mutation import judge, reach, selection, workers
from benchmarks.mutation.mutants import Mutant, mutants, source_hash

GLOO_SECONDS = 60.0
"""What a gloo case is taken to cost when a judge's deadline is set (the map does not run them)."""


@dataclass(frozen=True)
class Limits:
    """How many judges of each kind one mutant gets, and how long it may take: `timeout_base`
    seconds plus `timeout_factor` times its judges' measured cost."""

    max_cases: int = 40
    max_gloo: int = 4
    max_tests: int = 40
    timeout_base: float = 120.0
    timeout_factor: float = 3.0


@dataclass(frozen=True)
class Verdict:
    key: str
    module: str
    line: int
    before: str
    after: str
    status: str
    """killed, survived or timeout."""
    by: str
    """What killed it; for a survivor, the judges it passed."""
    seconds: float


class Session:
    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        path.mkdir(parents=True, exist_ok=True)

    # mutants -------------------------------------------------------------------------------------
    def mutants(self, module: str, stored: bool = False) -> list[Mutant]:
        """The module's mutants, made (and stored) on first use; ValueError if its source changed, unless
        `stored` (a report of what the session judged: the mutants it made, of the source it made them from)."""
        store = self.path / "mutants.json"
        known = json.loads(store.read_text()) if store.exists() else {}
        digest = source_hash((self.root / module).read_text())
        if module in known:
            if known[module]["hash"] != digest and not stored:
                raise ValueError(f"{module} changed since session {self.path} made its mutants; "
                                 f"judge the new code in a new --session")
            return [Mutant(**m) for m in known[module]["mutants"]]
        made = mutants(module, self.root)
        known[module] = {"hash": digest, "mutants": [dataclasses.asdict(m) for m in made]}
        store.write_text(json.dumps(known, indent=1))
        return made

    # verdicts ------------------------------------------------------------------------------------
    def verdicts(self) -> dict[str, Verdict]:
        path = self.path / "results.jsonl"
        if not path.exists():
            return {}
        out = {}
        for line in path.read_text().splitlines():
            if line.strip():
                v = Verdict(**json.loads(line))
                out[v.key] = v
        return out

    def killers(self, module: str, line: int) -> tuple[list[str], list[str]]:
        """The judges that killed the module's mutants so far: (those of `line`, those of its other lines),
        each the most kills first."""
        same: collections.Counter[str] = collections.Counter()
        other: collections.Counter[str] = collections.Counter()
        for v in self.verdicts().values():
            judge_id = selection.judge_of(v.by) if v.module == module and v.status == "killed" else None
            if judge_id:
                (same if v.line == line else other)[judge_id] += 1
        return [j for j, _ in same.most_common()], [j for j, _ in other.most_common()]

    def record(self, verdict: Verdict) -> None:
        with (self.path / "results.jsonl").open("a") as f:
            f.write(json.dumps(dataclasses.asdict(verdict)) + "\n")

    # the coverage map ----------------------------------------------------------------------------
    def reach(self, modules: list[str], test_files: list[str], select: list[str], log: TextIO) -> reach.Reach:
        """The coverage map of `modules`, measured (in a forked child, on a scratch copy) unless the
        stored one is of these sources and already maps them."""
        key = reach.project_key(self.root, test_files, select)
        path = self.path / "reach.json"
        if path.exists():
            stored = reach.Reach.load(path)
            if stored.key == key and set(modules) <= set(stored.lines):
                return stored
        print(f"measuring the coverage map: CI single-process cases and {len(test_files)} test files ...",
              file=log, flush=True)
        scratch = workers.Scratch(self.root, self.path / "scratch-map")
        every = sorted(set(modules) | (set(reach.Reach.load(path).lines) if path.exists() else set()))
        start = time.perf_counter()

        def body() -> int:
            reach.measure(scratch.path, every, test_files, select, key).save(path)
            return 0

        child = workers.fork(scratch.path, self.path / "logs" / "reach.log", 24 * 3600.0, body, None)
        try:
            _, how = workers.reap([child])
        except BaseException:
            workers.kill(child)
            raise
        if how != "exit 0" or not path.exists() or reach.Reach.load(path).key != key:
            raise RuntimeError(f"measuring the coverage map failed ({how}); see {self.path / 'logs' / 'reach.log'}")
        got = reach.Reach.load(path)
        print(f"coverage map measured in {time.perf_counter() - start:.0f} s: {len(got.case_seconds)} cases, "
              f"{len(got.test_seconds)} tests, {len(got.broken)} failing on the unmutated code (never judges)",
              file=log, flush=True)
        return got

    # judging -------------------------------------------------------------------------------------
    def run(self, modules: list[str], test_files: list[str], select: list[str], budget_s: float, jobs: int,
            limits: Limits, log: TextIO) -> bool:
        """Judge the modules' mutants without a verdict until the budget is spent; True if none is left."""
        start = time.monotonic()
        todo = {m: self.mutants(m) for m in modules}
        the_map = self.reach(modules, test_files, select, log)
        done = self.verdicts()
        originals = {m: (self.root / m).read_text() for m in modules}

        def judged_by(mutant: Mutant) -> tuple[selection.Plan, float]:
            p = selection.plan(the_map, mutant.module, mutant.line, the_map.gloo_cases, limits.max_cases,
                               limits.max_gloo, limits.max_tests, selection.import_lines(originals[mutant.module]),
                               mutant.before)
            p = selection.killers_first(p, *self.killers(mutant.module, mutant.line))
            return p, limits.timeout_base + limits.timeout_factor * selection.estimated_seconds(the_map, p,
                                                                                                GLOO_SECONDS)

        queue = [mu for module in modules for mu in todo[module] if mu.key not in done]
        print(f"{len(queue)} mutants to judge in {len(modules)} modules ({len(done)} judged before)",
              file=log, flush=True)
        return self._judge(queue, judged_by, {}, originals, start, budget_s, jobs, log)

    def rejudge(self, modules: list[str], test_files: list[str], skip: set[tuple[str, str, str]], budget_s: float,
                jobs: int, limits: Limits, log: TextIO) -> bool:
        """Judge the modules' survivors again (but those whose signature is in `skip`: the reviewed
        equivalents), each against the whole of `test_files` within `limits.timeout_base` seconds: the
        CUDA test files on a GPU machine, for lines only CUDA runs. A kill is recorded as a new verdict;
        a survivor's verdict keeps what it passed before. The budget counts from the first mutant, after the
        unmutated code has passed the files (`_control`). True if none is left."""
        todo = {m: self.mutants(m) for m in modules}
        done = self.verdicts()
        originals = {m: (self.root / m).read_text() for m in modules}
        against = selection.Plan(tests=list(test_files))
        mark = "; then passed " + " ".join(test_files)
        queue = [mu for module in modules for mu in todo[module]
                 if mu.key in done and done[mu.key].status == "survived" and mu.signature not in skip
                 and not done[mu.key].by.endswith(mark)]
        print(f"{len(queue)} survivors to judge against {len(test_files)} test files", file=log, flush=True)
        if queue:
            self._control(against, limits.timeout_base, log)
        before = {mu.key: done[mu.key].by + mark for mu in queue}
        return self._judge(queue, lambda mutant: (against, limits.timeout_base), before, originals,
                           time.monotonic(), budget_s, jobs, log)  # the budget is for mutants, not the control

    def _control(self, p: selection.Plan, timeout: float, log: TextIO) -> None:
        """Judge the unmutated code by `p`; RuntimeError unless it passes (a judge that fails on it would kill
        every mutant)."""
        scratch = workers.Scratch(self.root, self.path / "scratch-control")
        out = self.path / "logs" / "control.json"
        out.unlink(missing_ok=True)
        child = workers.fork(scratch.path, out.with_suffix(".log"), timeout, lambda: judge.run(p, out), None)
        try:
            _, how = workers.reap([child])
        except BaseException:
            workers.kill(child)
            raise
        got = json.loads(out.read_text()) if out.exists() else {"status": how, "by": ""}
        if got["status"] != "survived":
            raise RuntimeError(f"the judges fail on the unmutated code ({got['status']}: {got['by'] or how}); "
                               f"see {out.with_suffix('.log')}")
        print("the unmutated code passes them", file=log, flush=True)

    def _judge(self, queue: list[Mutant], judged_by: Callable[[Mutant], tuple[selection.Plan, float]],
               before: dict[str, str], originals: dict[str, str], start: float, budget_s: float, jobs: int,
               log: TextIO) -> bool:
        """Judge `queue` `jobs` at a time, each by `judged_by(mutant)` -> (its plan, its time limit). A
        mutant in `before` is a survivor judged again: if it survives, `before[key]` is its verdict's `by`."""
        scratches = [workers.Scratch(self.root, self.path / f"scratch-{i}") for i in range(jobs)]
        free = list(range(jobs))
        running: list[workers.Child] = []
        judged = 0
        try:
            while queue or running:
                while queue and free and time.monotonic() - start < budget_s:
                    mutant, w = queue.pop(0), free.pop()
                    p, timeout = judged_by(mutant)
                    if p.empty:
                        self.record(_verdict(mutant, "survived", "no judge executes this line", 0.0))
                        free.append(w)
                        continue
                    scratches[w].write(mutant.module, mutant.source(originals[mutant.module]))
                    out = self.path / "logs" / f"{_safe(mutant.key)}.json"
                    out.unlink(missing_ok=True)
                    running.append(workers.fork(scratches[w].path, out.with_suffix(".log"), timeout,
                                                lambda p=p, out=out: judge.run(p, out), (mutant, w, p, out)))
                if not running:
                    break
                child, how = workers.reap(running)
                running.remove(child)
                mutant, w, p, out = child.tag
                scratches[w].restore(mutant.module)
                free.append(w)
                seconds = time.monotonic() - child.started
                if how == "timeout":
                    v = _verdict(mutant, "timeout", f"past {child.deadline - child.started:.0f} s", seconds)
                elif out.exists():
                    got = json.loads(out.read_text())
                    by = got["by"] or (f"passed {len(p.cases)} cpu cases, {len(p.gloo)} gloo cases, "
                                       f"{len(p.lead) + len(p.tests)} tests")
                    v = _verdict(mutant, got["status"], by, seconds)
                else:
                    v = _verdict(mutant, "killed", f"judge process ended by {how}", seconds)
                if mutant.key in before:
                    v = dataclasses.replace(v, by=before[mutant.key] if v.status == "survived" else
                                            f"{v.by} (a survivor judged again)")
                self.record(v)
                judged += 1
                print(f"[{judged}] {v.status:8} {v.seconds:6.1f}s {mutant.module}:{mutant.line} "
                      f"{mutant.before!r} -> {mutant.after!r}  {v.by}", file=log, flush=True)
        finally:
            for child in running:  # stopped (Ctrl-C, SIGTERM): no judge outlives the driver
                workers.kill(child)
        return not queue


def _verdict(m: Mutant, status: str, by: str, seconds: float) -> Verdict:
    return Verdict(m.key, m.module, m.line, m.before, m.after, status, by, round(seconds, 2))


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)

"""The conformance tier as tests of your own pytest suite (entry point `pytest11`).

    pytest -n auto --muon-target=my_pkg.targets:target [--muon-tier=ci|nightly|gpu]
           [--muon-select=SUBSTRING ...] [--muon-backend=cpu,gloo,...] [--muon-out=DIR]

Write each value with `=`: pytest chooses its rootdir (and ini file) before plugin options
are known, so a separate value that is an existing path would count as a test path.

One test per (backend, case): node id `muon-<backend>::<case id>`. A test fails when any
of the case's checks fails or errors (the message lists each failing check with its ratio,
tolerance source, message, diagnosis when records carry one, and the repro command); it is
skipped, with the reasons, when every check is unsupported or skipped; it passes otherwise.
Each test hands its records to the controlling process through `report.user_properties`
(JSON), so under xdist the controller aggregates every worker's records and, at the end of
the session, writes to --muon-out the same stored run as `python -m harness run`
(results.parquet, results.csv, run.json, report.html, summary.md). A case whose test ends
without records is an error on each of its checks there, saying why: under xdist, the worker
that crashed in it (a target's os._exit or fatal signal; xdist replaces the worker and the
session goes on); otherwise the harness's traceback. Without xdist such a crash ends pytest
itself, and nothing is stored.

Exit status: pytest's. 0 every test passed (or was skipped); 1 a test failed; 4 (pytest's
usage error, `USAGE_EXIT`) a bad --muon-* option, reported in one line before any test runs or
anything is written: a target that is no alias or MODULE:CALLABLE returning a Target, or whose
module fails to import; an unknown tier or backend; a selection that matches no case; a
--muon-out that is a file or cannot be created.

A pull request's diff: this plugin judges one checkout. Its --muon-out run is a stored run like
`python -m harness run`'s, so `python -m harness pr-diff --base-ref REF --target SPEC --head-run DIR`
(with the session's --muon-select values as --select) reuses it as the head and runs the base.

Inert without --muon-target: only the options are added and nothing is imported beyond
this module, so a session of anyone who has the package installed is unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from harness.judging.scope import Judgement
    from cases import Case
    from reports import Record

PROPERTY = "muon_records"
"""user_properties key under which a test's records travel to the controller, as JSON."""
PICTURES = "muon_pictures"
"""xdist workeroutput key: a worker's worst reference checks and their evidence, for the report's pictures."""

USAGE_EXIT = int(pytest.ExitCode.USAGE_ERROR)
"""The exit status of a session with a bad --muon-* option: pytest's usage error, 4."""

SESSION_PLUGIN = "muon-conformance-session"
"""Name under which the session object below is registered when --muon-target is given."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("muon", "Muon conformance: judge a Muon implementation case by case")
    group.addoption("--muon-target", metavar="MODULE:CALLABLE",
                    help="harness target to judge (alias or MODULE:CALLABLE returning a harness Target); "
                         "without it this plugin does nothing. A bad --muon-* option exits with status "
                         f"{USAGE_EXIT} (pytest's usage error) before any test runs")
    group.addoption("--muon-tier", default="ci", metavar="TIER", help="case tier: ci (default) or nightly")
    group.addoption("--muon-select", action="append", default=[], metavar="SUBSTRING",
                    help="keep cases whose id contains SUBSTRING (repeatable); a full case id runs that case")
    group.addoption("--muon-backend", default="cpu", metavar="NAMES",
                    help="comma-separated harness backends (default: cpu)")
    group.addoption("--muon-out", type=Path, metavar="DIR",
                    help="write the stored run, report.html and summary.md here at the end of the session, "
                         "whole, replacing a stored run there; a folder of other files is refused "
                         "(write --muon-out=DIR: a separate existing path would move pytest's rootdir)")
    group.addoption("--muon-allow-thin", action="store_true",
                    help="do not fail the session when the whole tier judged too little to mean anything "
                         "(harness/judging/scope.py); it is still said")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("muon_target") is None:
        return
    config.pluginmanager.register(ConformanceSession(config), SESSION_PLUGIN)


class CaseFailed(Exception):
    """A case with at least one failing or erroring check; carries its records and how to rerun it."""

    def __init__(self, records: list[Record], rerun: str) -> None:
        super().__init__(f"{sum(r.failing for r in records)} of {len(records)} checks failing")
        self.records = records
        self.rerun = rerun

    def describe(self) -> str:
        """Each failing check (ratio, tolerance and its source when measured; message), the diagnoses
        when the records carry any, the other checks, then the commands that rerun the case alone."""
        from reports.records import format_metric

        lines = []
        for r in (r for r in self.records if r.failing):
            measured = format_metric(r.ratio)
            lines.append(f"{r.status.upper()} {r.check}" + (f" (ratio {measured}, rtol {format_metric(r.tolerance)}; "
                                                            f"{r.tolerance_source})" if measured else ""))
            lines += [f"    {line}" for line in r.message.strip().splitlines()]
        diagnoses = dict.fromkeys(d for r in self.records if (d := getattr(r, "diagnosis", "")))
        lines += [f"diagnosis: {d}" for d in diagnoses]
        others = [f"{r.check} {r.status}" for r in self.records if not r.failing]
        if others:
            lines.append("other checks: " + ", ".join(others))
        lines.append(f"repro: {self.records[0].repro}")
        lines.append(f"repro in pytest: {self.rerun}")
        return "\n".join(lines)


class CaseItem(pytest.Item):
    """One case on one backend: runs every applicable check of the case."""

    def __init__(self, *, case: Case, backend: str, session_plugin: ConformanceSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.backend = backend
        self.session_plugin = session_plugin

    def runtest(self) -> None:
        import torch

        from harness.runner import judged_case

        plugin = self.session_plugin
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the harness runs: deterministic kernels, parallelism from processes
        try:
            records = judged_case(self.case, plugin.target, plugin.spec, self.backend, pictures=plugin.pictures)
        finally:
            torch.set_num_threads(threads)
        self.user_properties.append((PROPERTY, json.dumps([dataclasses.asdict(r) for r in records])))
        if not records:
            pytest.fail(f"{self.case.id}: the harness produced no check, so nothing was judged", pytrace=False)
        if any(r.failing for r in records):
            raise CaseFailed(records, plugin.rerun(self.case, self.backend))
        if all(r.status in ("unsupported", "skipped") for r in records):
            pytest.skip("; ".join(sorted({f"{r.status}: {r.message}" for r in records})))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CaseFailed):
            return excinfo.value.describe()
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.case.id} [{self.backend}]"


class BackendCases(pytest.Collector):
    """The selected cases that one backend runs (node id `muon-<backend>`), one item each."""

    def __init__(self, *, backend: str, session_plugin: ConformanceSession, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backend = backend
        self.session_plugin = session_plugin

    def collect(self) -> list[CaseItem]:
        from harness.running import backends

        accepts = backends.get(self.backend).accepts
        return [CaseItem.from_parent(self, name=case.id, case=case, backend=self.backend,
                                     session_plugin=self.session_plugin)
                for case in self.session_plugin.cases if accepts(case)]


class ConformanceSession:
    """Everything the plugin does once --muon-target is given: validates the options (a bad one is
    a one-line usage error before any test runs), adds the cases as items, gathers their records
    and, on the controller (or a session without xdist), writes the run to --muon-out."""

    def __init__(self, config: pytest.Config) -> None:
        from cases import TIERS
        from harness.runner import BACKENDS
        from harness.running.selection import narrow, target_tier
        from harness.targets import TargetError, load_target, target_module
        from harness.targets.identity import module_identity

        self.config = config
        self.spec: str = config.getoption("muon_target")
        self.tier: str = config.getoption("muon_tier")
        self.patterns: list[str] = config.getoption("muon_select")
        self.out: Path | None = config.getoption("muon_out")
        if self.tier not in TIERS:
            raise pytest.UsageError(f"--muon-tier {self.tier!r}: expected one of {', '.join(TIERS)}")
        names = [b.strip() for b in config.getoption("muon_backend").split(",") if b.strip()]
        unknown = [b for b in names if b not in BACKENDS]
        if not names or unknown or len(set(names)) != len(names):
            raise pytest.UsageError(f"--muon-backend {config.getoption('muon_backend')!r}: name distinct "
                                    f"backends of {', '.join(BACKENDS)}")
        self.backends = names
        try:
            self.target = load_target(self.spec)
        except TargetError as exc:
            raise pytest.UsageError(f"--muon-target: {exc}") from None
        except Exception as exc:  # a target module that raises on import is bad input too, whatever it raises
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise pytest.UsageError(f"--muon-target {self.spec!r}: loading it raised {type(exc).__name__}: {first}") \
                from None
        try:
            self.own = target_tier(self.tier, self.target)
        except Exception as exc:  # an adapter's unsupported() that raises is bad input too
            raise pytest.UsageError(f"--muon-target {self.spec!r}: asking what it supports raised "
                                    f"{type(exc).__name__}: {exc}") from None
        self.code = module_identity(target_module(self.spec)) if self.is_controller else None
        """The code judged, as imported when the session started."""
        self.cases = narrow(self.own.cases, self.patterns)
        if not self.cases:
            raise pytest.UsageError(f"--muon-select {self.patterns}: no case of the target's {self.tier!r} tier matches")
        self.judged: Judgement | None = None
        if self.out is not None and self.is_controller:  # checked as the session's end will claim it
            from reports.run_folder import StoreError, check, estimated_bytes
            try:
                check(self.out, replace=True, expected_bytes=estimated_bytes(len(self.cases) * len(self.backends)))
            except StoreError as exc:
                raise pytest.UsageError(f"--muon-out {exc}") from None
        self.records: dict[str, list[Record]] = {}
        from harness.judging.details import Pictures

        self.pictures = Pictures()
        """This process's worst reference checks; xdist workers send theirs to the controller at the end."""
        self.expected: set[str] = set()
        """Node ids of the cases this session runs (after -k/-m/--deselect), to tell a complete run."""
        self.incomplete = ""
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.t0 = time.perf_counter()

    def rerun(self, case: Case, backend: str) -> str:
        """The pytest command that reruns `case` alone on `backend`."""
        return shlex.join(["pytest", "-p", "harness.pytest_plugin", f"--muon-target={self.spec}",
                           f"--muon-backend={backend}", f"--muon-select={case.id}"])

    @property
    def is_controller(self) -> bool:
        """True in the process that writes: the xdist controller, or a session without xdist."""
        return not hasattr(self.config, "workerinput")

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        """Collect the cases (reported like any collection) and append them before -k, -m and
        --deselect filter the items, so that those apply to them too."""
        for name in self.backends:
            cases = BackendCases.from_parent(session, name=f"muon-{name}", nodeid=f"muon-{name}", backend=name,
                                             session_plugin=self)
            items.extend(session.genitems(cases))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.expected = {item.nodeid for item in session.items if isinstance(item, CaseItem)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The xdist controller collects nothing itself: its workers' collections say what runs."""
        self.expected = {i for i in ids if i.startswith(tuple(f"muon-{b}::" for b in self.backends))}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the records a test carried (on the controller, reports come from every worker). A case's
        test that failed without records (its xdist worker crashed in it: the target's os._exit or a fatal
        signal; or the harness raised) gets an error on each of its checks, saying why."""
        for key, value in report.user_properties:
            if key == PROPERTY and report.nodeid not in self.records:
                self.records[report.nodeid] = _decode(value)
        if report.failed and report.nodeid not in self.records and report.nodeid in self.expected:
            self.records[report.nodeid] = self._unjudged(report)

    def _unjudged(self, report: pytest.TestReport) -> list[Record]:
        """The error records of a case whose test `report` failed before it produced records."""
        from cases import Case
        from harness.runner import failed_case

        group, _, case_id = report.nodeid.partition("::")
        if report.when in ("setup", "call", "teardown"):
            why = f"the test of this case failed before it produced records:\n{report.longreprtext}"
        else:  # xdist's report of the item a crashed worker was running
            why = (f"{report.longreprtext}: the pytest-xdist worker process judging this case died (the target's "
                   f"os._exit or a fatal signal such as SIGSEGV, or it was killed); xdist replaced it")
        return failed_case(Case.from_id(case_id), self.target, self.spec, group.removeprefix("muon-"), why)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: keep the worst pictures of a worker that finished."""
        import numpy as np

        from harness.judging.outcome import Evidence
        from reports import Record

        for record, (where, judged, reference) in getattr(node, "workeroutput", {}).get(PICTURES, []):
            self.pictures.offer(Record(**record), Evidence(where, np.array(judged), np.array(reference)))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.is_controller:  # an xdist worker: its worst pictures travel to the controller
            self.config.workeroutput[PICTURES] = [
                (dataclasses.asdict(r), (e.where, e.judged.tolist(), e.reference.tolist()))
                for r, e in self.pictures.kept()]
            return
        self.incomplete = self._incomplete(session)
        from harness.judging.scope import judgement

        records = [r for node in sorted(self.records) for r in self.records[node]]
        self.judged = judgement(self.own, self.cases, records, self.backends, bool(self.patterns))
        if self.judged.thin and not self.config.getoption("muon_allow_thin") and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.out is None:
            return
        import torch

        from harness.apps.outputs import write_run
        from harness.targets.identity import module_identity
        from reports import RunInfo
        from reports.store import project_commit

        args = self.config.invocation_params.args
        info = RunInfo(target=f"{self.target.name} [{self.spec}] {self.target.version()}", tier=self.tier,
                       backends=",".join(self.backends), command=shlex.join(["pytest", *args]),
                       started=self.started.isoformat(timespec="seconds"), seconds=time.perf_counter() - self.t0,
                       torch_version=torch.__version__, commit=project_commit(), selection=tuple(self.patterns),
                       interrupted=self.incomplete, scope=self.judged.scope, thin=self.judged.thin, judged=self.code,
                       harness=module_identity("harness"))
        write_run(records, info, self.out, self.pictures)

    def _incomplete(self, session: pytest.Session) -> str:
        """Why some selected case has no records (-x, --maxfail, Ctrl-C, a crash), or "" if none lacks them."""
        missing = self.expected - self.records.keys()
        if not missing:
            return ""
        why = session.shouldfail or session.shouldstop or "the session ended first"
        return f"{len(missing)} of {len(self.expected)} cases did not run ({why})"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.is_controller or self.config.option.collectonly:
            return
        from reports import status_counts

        counts = status_counts(r for records in self.records.values() for r in records)
        line = (f"muon conformance of {self.spec}: {sum(counts.values())} checks: "
                + ", ".join(f"{n} {s}" for s, n in counts.items()))
        if self.out is not None:
            line += f"; stored run and report in {self.out}/"
        terminalreporter.write_sep("-", line)
        if self.judged is not None:
            terminalreporter.write_line(f"muon conformance {self.judged.scope}")
            if self.judged.thin:
                terminalreporter.write_line(f"muon conformance THIN: {self.judged.thin}"
                                            + ("" if self.config.getoption("muon_allow_thin")
                                               else " (the session fails; --muon-allow-thin accepts it)"), red=True)
        if self.incomplete:
            terminalreporter.write_line(f"muon conformance INCOMPLETE: {self.incomplete}", red=True)


def _decode(text: str) -> list[Record]:
    """Records from a test's JSON property (as `runtest` wrote them; NaN travels as JSON's NaN)."""
    from reports import Record

    return [Record(**row) for row in json.loads(text)]

"""benchmarks/mutation: mutants named stably, judges chosen by what reaches a line, the reviewed list of
equivalent mutants validated, the table's arithmetic, bad usage refused before any work, and one real
mutant judged end to end (killed; the unmutated code, under the same judges, survives)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray", reason="the mutation extra: pip install -e '.[mutation]'")

from benchmarks.mutation import equivalent, judge, selection, table, workers  # noqa: E402
from benchmarks.mutation.__main__ import MODULES, ROOT, main  # noqa: E402
from benchmarks.mutation.mutants import annotation_only, changed_lines, mutants  # noqa: E402
from benchmarks.mutation.reach import Reach  # noqa: E402
from benchmarks.mutation.session import Session, Verdict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

TOY = "def f(x):\n    if x > 0:\n        return x + 1\n    return 0.5\n"


def toy_mutants(tmp_path: Path, source: str = TOY):
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "toy.py").write_text(source)
    return mutants("pkg/toy.py", tmp_path)


def test_each_mutant_changes_one_place_and_is_named_by_it(tmp_path):
    made = toy_mutants(tmp_path)
    assert len(made) > 10
    for m in made:
        mutated = m.source(TOY)
        assert mutated != TOY
        assert changed_lines(TOY, mutated) == (m.line, m.before, m.after)
        assert m.before in TOY
    assert any(m.before == "if x > 0:" and m.after == "if x >= 0:" for m in made)
    assert any(m.before == "return 0.5" and m.after == "return 1.5" for m in made)


def test_a_removed_decorator_is_placed_on_its_line_not_the_blank_lines_above():
    """cosmic-ray's RemoveDecorator changes the blank lines above the decorator too; the mutant's line is the
    decorator's, which the map sees run at import (the blank line's mutants had no judge, and survived)."""
    source = "import dataclasses\n\n\n@dataclasses.dataclass(frozen=True)\nclass A:\n    x: int = 0\n"
    mutated = source.replace("\n\n@dataclasses.dataclass(frozen=True)", "")
    line, before, after = changed_lines(source, mutated)
    assert line == 4 and before.endswith("@dataclasses.dataclass(frozen=True)")
    assert line in selection.import_lines(source)


def test_a_signature_survives_an_edit_elsewhere(tmp_path):
    before = {m.signature for m in toy_mutants(tmp_path)}
    after = toy_mutants(tmp_path, "import math\n\n" + TOY)
    lines = {m.signature: m.line for m in after}
    assert before <= set(lines)
    assert all(lines[s] > 2 for s in before)  # the lines moved, the names did not


def write_list(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "equivalent.toml"
    path.write_text(text)
    return path


GOOD = '[[equivalent]]\nmodule = "m.py"\nbefore = "a > 0"\nafter = "a >= 0"\nreason = "a is never 0"\n'


def test_the_reviewed_list_loads_by_signature(tmp_path):
    got = equivalent.load(write_list(tmp_path, GOOD))
    assert list(got) == [("m.py", "a > 0", "a >= 0")] and got[("m.py", "a > 0", "a >= 0")].reason == "a is never 0"


@pytest.mark.parametrize("text,named", [
    (GOOD.replace('reason = "a is never 0"\n', ""), "'reason'"),
    (GOOD.replace('"a is never 0"', '"  "'), "'reason'"),
    (GOOD + 'why = "x"\n', "unknown fields"),
    (GOOD + GOOD, "listed twice"),
    ("[[equivalents]]\n", "unknown tables"),
])
def test_a_bad_entry_is_refused_naming_it(tmp_path, text, named):
    with pytest.raises(ValueError, match=named):
        equivalent.load(write_list(tmp_path, text))


def stale(entries: dict) -> list[equivalent.Equivalent]:
    """Entries whose original lines no longer appear in their module (the code moved on: review them)."""
    out = []
    for e in entries.values():
        path = ROOT / e.module
        lines = [s.strip() for s in path.read_text().split("\n")] if path.exists() else []
        before = e.before.split("\n")
        if not any(lines[i:i + len(before)] == before for i in range(len(lines))):
            out.append(e)
    return out


def test_the_default_modules_are_every_algorithm_and_every_oracle():
    """A module missing from MODULES is never judged, nightly or by the documented command (stages.py and
    adamw_reference.py were missing)."""
    for package in ("optimizers/algorithms", "oracles"):
        modules = {str(p.relative_to(ROOT)) for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}
        assert modules - set(MODULES) == set(), package
    assert len(set(MODULES)) == len(MODULES) and all((ROOT / m).is_file() for m in MODULES)


def test_every_listed_equivalent_names_code_that_exists():
    entries = equivalent.load()
    assert stale(entries) == []
    for e in entries.values():
        assert e.before != e.after


def test_a_stale_entry_is_found(tmp_path):
    """Control for the test above: an entry whose line is gone is reported."""
    text = GOOD.replace('"m.py"', '"optimizers/norms.py"').replace('"a > 0"', '"count < CASCADE_FROM_GONE"')
    assert len(stale(equivalent.load(write_list(tmp_path, text)))) == 1


def fake_reach() -> Reach:
    lines = {"optimizers/x.py": {3: (["c-slow", "c-fast", "c-bad"], ["t1"]), 4: ([], ["t2", "t1"]), 1: ([], [])},
             "oracles/y.py": {}}
    return Reach("k", {"c-slow": 2.0, "c-fast": 0.1, "c-bad": 0.01}, {"t1": 1.0, "t2": 0.5}, lines,
                 ["muon/a/ws2", "normuon/b/ws2", "dion2-f0.5/c/ws2", "normuon/d/ws4"], ["c-bad"])


def test_judges_are_what_reaches_the_line_cheapest_first():
    reach = fake_reach()
    p = selection.plan(reach, "optimizers/x.py", 3, reach.gloo_cases, 40, 4, 40)
    assert p == selection.Plan(["c-fast", "c-slow"], [], ["t1"])  # c-bad fails unmutated: never a judge
    assert selection.plan(reach, "optimizers/x.py", 3, reach.gloo_cases, 1, 4, 0) == selection.Plan(["c-fast"])
    assert selection.plan(reach, "optimizers/x.py", 4, reach.gloo_cases, 40, 4, 40) == selection.Plan(
        [], [], ["t2", "t1"])


def test_a_line_run_at_import_is_judged_by_everything_that_reaches_its_module():
    """Line 1 ran when the module was imported, under no case or test (a default, a constant): every case of
    the module judges it, past max_cases, and its cheapest tests; an unexecuted line (9) does not get them."""
    reach = fake_reach()
    assert selection.plan(reach, "optimizers/x.py", 1, reach.gloo_cases, 1, 4, 1) == selection.Plan(
        ["c-fast", "c-slow"], [], ["t2"])
    assert selection.plan(reach, "optimizers/x.py", 9, reach.gloo_cases, 1, 4, 1).cases == []
    # a table's later line (9), which coverage never records: run at import all the same
    assert selection.plan(reach, "optimizers/x.py", 9, reach.gloo_cases, 1, 4, 1, frozenset({9})).cases == [
        "c-fast", "c-slow"]


def test_a_line_run_at_import_is_judged_first_by_the_tests_that_build_optimizers_with_their_defaults():
    """A changed default (Dion2's lr 0.01 -> 1.01 in its signature) is seen only by a test that builds the class with
    no option: for a line run at import, selection.DEFAULTS_TESTS come before the module's own tests however slow;
    for a line a test executes, they keep their place (the control)."""
    reach = fake_reach()
    defaults = selection.DEFAULTS_TESTS[0] + "[dion2-nothing]"
    reach.lines["optimizers/x.py"][4] = ([], ["t2", "t1", "tests/test_x.py::own", defaults])
    reach.test_seconds.update({"tests/test_x.py::own": 0.2, defaults: 9.0})
    assert selection.plan(reach, "optimizers/x.py", 1, reach.gloo_cases, 1, 4, 2).tests == [
        defaults, "tests/test_x.py::own"]
    assert selection.plan(reach, "optimizers/x.py", 4, reach.gloo_cases, 1, 4, 2).tests == [
        "tests/test_x.py::own", "t2"]


def test_a_line_run_at_import_is_judged_by_its_modules_own_tests_that_execute_none_of_its_lines():
    """A frozen dataclass's decorator: its own test (setting a field, hashing) runs only generated code, so coverage
    maps it to no line of the module; a line run at import is judged by it all the same, unless it fails unmutated.
    A line a test executes is not (the control)."""
    reach = fake_reach()
    reach.test_seconds.update({"tests/test_x.py::frozen": 0.3, "tests/test_x.py::broken": 0.1})
    reach.broken.append("tests/test_x.py::broken")
    assert selection.plan(reach, "optimizers/x.py", 1, reach.gloo_cases, 1, 4, 5).tests == [
        "tests/test_x.py::frozen", "t2", "t1"]
    assert "tests/test_x.py::frozen" not in selection.plan(reach, "optimizers/x.py", 4, reach.gloo_cases, 1, 4, 5).tests


def test_a_subpackages_modules_own_tests_include_the_test_files_named_for_its_packages():
    """optimizers/algorithms/base.py's frozen records are tested in tests/test_algorithms.py, which executes none of
    base.py's lines: a decorator mutant of base.py is judged by it; a test file named for no package of the module
    is not (the control)."""
    reach = fake_reach()
    reach.lines["optimizers/algorithms/base.py"] = {1: ([], []), 5: (["c-fast"], ["t1"])}
    reach.test_seconds.update({"tests/test_algorithms.py::frozen": 0.3, "tests/test_other.py::frozen": 0.3})
    tests = selection.plan(reach, "optimizers/algorithms/base.py", 1, reach.gloo_cases, 1, 4, 5).tests
    assert tests == ["tests/test_algorithms.py::frozen", "t1"]
    assert selection.own_test_prefixes("oracles/spectral.py") == (
        "tests/test_spectral.py::", "tests/test_spectral_", "tests/test_oracles.py::", "tests/test_oracles_")


def test_import_lines_are_module_and_class_statements_and_signatures_not_function_bodies():
    source = ("TABLE = (\n    (1, 2),\n    (3, 4),\n)\n\n\nclass A:\n    X = 1\n\n    def f(self, a=(1,\n"
              "                             2)):\n        return a\n")
    assert selection.import_lines(source) == frozenset({1, 2, 3, 4, 7, 8, 10, 11})


def test_the_modules_own_tests_judge_first_however_slow():
    """tests/test_x.py's tests of a line come before cheaper tests of other files; within each, cheapest first."""
    reach = fake_reach()
    reach.lines["optimizers/x.py"][5] = ([], ["tests/test_other.py::a", "tests/test_x.py::slow", "tests/test_x.py::b"])
    reach.test_seconds.update({"tests/test_other.py::a": 0.1, "tests/test_x.py::slow": 9.0, "tests/test_x.py::b": 1.0})
    assert selection.plan(reach, "optimizers/x.py", 5, reach.gloo_cases, 40, 4, 2).tests == [
        "tests/test_x.py::b", "tests/test_x.py::slow"]


def test_tests_named_for_the_lines_rarest_identifier_judge_before_cheaper_ones():
    """A line every case runs with a branch only some reach (`shape[0] // self.num_heads`): after the module's own
    tests, the tests named for its rarest identifier come first, however slow; a common one (shape) weighs less;
    tests named for nothing keep cheapest first. Without the line's text, cheapest first (the negative control)."""
    reach = fake_reach()
    line = ["tests/test_a.py::test_shape_cheap", "tests/test_b.py::test_num_heads_alone", "tests/test_c.py::test_fast",
            "tests/test_d.py::test_shape_other", "tests/test_x.py::own"]
    reach.lines["optimizers/x.py"][5] = ([], line)
    reach.test_seconds.update(zip(line, [0.2, 9.0, 0.1, 0.3, 5.0]))
    text = "return as_matrices(stack, self.flatten, None if self.num_heads is None else shape[0] // self.num_heads)"
    assert selection.plan(reach, "optimizers/x.py", 5, reach.gloo_cases, 40, 4, 3, text=text).tests == [
        "tests/test_x.py::own", "tests/test_b.py::test_num_heads_alone", "tests/test_a.py::test_shape_cheap"]
    assert selection.plan(reach, "optimizers/x.py", 5, reach.gloo_cases, 40, 4, 3).tests == [
        "tests/test_x.py::own", "tests/test_c.py::test_fast", "tests/test_a.py::test_shape_cheap"]


def test_unreached_optimizer_code_gets_the_gloo_cases_of_its_algorithms():
    reach = fake_reach()
    p = selection.plan(reach, "optimizers/algorithms/normuon.py", 9, reach.gloo_cases, 40, 4, 40)
    assert p.gloo == ["normuon/b/ws2", "normuon/d/ws4"] and not p.cases and not p.tests
    reach.test_seconds["tests/test_distributed_normuon.py::refused"] = 3.0  # named for it: its rank pools judge
    p = selection.plan(reach, "optimizers/algorithms/normuon.py", 9, reach.gloo_cases, 40, 4, 40)
    assert p.tests == ["tests/test_distributed_normuon.py::refused"]
    reach.test_seconds["tests/test_normuon.py::cheap"] = 0.1  # named too, single-process: after the rank pools'
    p = selection.plan(reach, "optimizers/algorithms/normuon.py", 9, reach.gloo_cases, 40, 4, 1)
    assert p.tests == ["tests/test_distributed_normuon.py::refused"]
    shared = selection.plan(reach, "optimizers/x.py", 9, reach.gloo_cases, 40, 2, 40)
    assert shared.gloo == ["muon/a/ws2", "normuon/b/ws2"]  # spread over every algorithm's
    assert shared.tests == ["tests/test_distributed_normuon.py::refused"]  # every algorithm's rank pools
    reach.test_seconds["tests/test_x.py::named"] = 0.1
    assert selection.plan(reach, "optimizers/x.py", 9, reach.gloo_cases, 40, 2, 40).tests == [
        "tests/test_distributed_normuon.py::refused", "tests/test_x.py::named"]
    reach.test_seconds["tests/test_distributed_muon.py::fsdp2"] = 5.0  # not muon's: not normuon.py's judge
    assert selection.plan(reach, "optimizers/algorithms/normuon.py", 9, reach.gloo_cases, 40, 4, 40).tests == [
        "tests/test_distributed_normuon.py::refused", "tests/test_normuon.py::cheap"]
    assert selection.plan(reach, "oracles/y.py", 9, reach.gloo_cases, 40, 4, 40).empty


def test_an_oracle_only_distributed_cases_call_is_judged_by_gloo_cases_of_its_placements():
    """The TP reference's lines no single-process case runs: its unit tests, then the tensor-parallel gloo cases
    (the harness computes the reference in its own process); another oracle's unreached line gets none."""
    reach = Reach("k", {"c": 1.0}, {"t1": 1.0}, {"oracles/tensor_parallel.py": {5: ([], ["t1"]), 6: (["c"], [])}},
                  ["muon/a/x/shard0/ws2", "muon/b/x/tp0-gather/ws2", "muon/c/x/dp2tp1-gather/ws4"], [])
    p = selection.plan(reach, "oracles/tensor_parallel.py", 5, reach.gloo_cases, 40, 4, 40)
    assert p == selection.Plan([], ["muon/b/x/tp0-gather/ws2", "muon/c/x/dp2tp1-gather/ws4"], ["t1"])
    assert selection.plan(reach, "oracles/tensor_parallel.py", 6, reach.gloo_cases, 40, 4, 40).gloo == []
    assert selection.plan(reach, "oracles/y.py", 5, reach.gloo_cases, 40, 4, 40).empty


def test_a_line_naming_distributed_things_gets_gloo_cases_after_its_own_judges():
    """A line single-process cases run but whose branch only ranks take (`process_group is not None and ...`) is
    judged by the gloo cases too; a line naming nothing distributed, or an oracle's, is not (the controls)."""
    reach = fake_reach()
    p = selection.plan(reach, "optimizers/x.py", 3, reach.gloo_cases, 40, 2, 40,
                       text="if process_group is not None and uses_mesh_layout(p):")
    assert p.cases == ["c-fast", "c-slow"] and p.gloo == ["muon/a/ws2", "normuon/b/ws2"] and p.tests == ["t1"]
    assert selection.plan(reach, "optimizers/x.py", 3, reach.gloo_cases, 40, 2, 40, text="x = a + b").gloo == []
    reach.lines["oracles/y.py"] = {3: (["c-fast"], [])}
    assert selection.plan(reach, "oracles/y.py", 3, reach.gloo_cases, 40, 2, 40, text="mesh = 1").gloo == []


def test_the_judges_that_killed_a_lines_mutants_judge_its_next_one_first_and_the_verdict_is_the_same(tmp_path):
    """Killers first reorders a plan and adds no judge: the same line's killers, then the module's others,
    each the most kills first, and only the line's own killer tests lead; a survivor's `by` and a kill by an
    import name no judge."""
    session = Session(tmp_path / "s", ROOT)
    for i, (module, line, status, by) in enumerate([
            ("m.py", 5, "killed", "test t3"), ("m.py", 5, "killed", "cpu case c2: norm fail"),
            ("m.py", 5, "killed", "test t3 (a survivor judged again)"), ("m.py", 7, "killed", "test t2"),
            ("m.py", 7, "killed", "test t2"), ("m.py", 7, "killed", "test t1"), ("other.py", 5, "killed", "test t1"),
            ("m.py", 5, "survived", "passed 3 cpu cases, 0 gloo cases, 3 tests"),
            ("m.py", 5, "killed", "import: SyntaxError: bad")]):
        session.record(Verdict(f"k{i}", module, line, "a", "b", status, by, 1.0))
    assert session.killers("m.py", 5) == (["t3", "c2"], ["t2", "t1"])
    assert session.killers("m.py", 7) == (["t2", "t1"], ["t3", "c2"])
    p = selection.Plan(["c1", "c2", "c3"], ["g1"], ["t1", "t2", "t3", "t4"])
    assert selection.killers_first(p, *session.killers("m.py", 5)) == selection.Plan(
        ["c2", "c1", "c3"], ["g1"], ["t2", "t1", "t4"], lead=["t3"])  # only the line's own killers lead
    assert selection.killers_first(p, ["t9", "t4", "t3", "t2", "t1"], []) == selection.Plan(
        p.cases, p.gloo, ["t1"], ["t4", "t3", "t2"])  # at most LEAD_TESTS
    assert selection.killers_first(p, [], []) == p
    assert selection.judge_of("test tests/x.py::t[a b]") == "tests/x.py::t[a b]"
    assert selection.judge_of("gloo case muon/x/tp0-gather/ws2: norm fail") == "muon/x/tp0-gather/ws2"


def test_the_reach_map_round_trips(tmp_path):
    reach = fake_reach()
    reach.save(tmp_path / "reach.json")
    assert Reach.load(tmp_path / "reach.json") == reach


def verdict(status: str, by: str = "", before: str = "a > 0", module: str = "m.py") -> Verdict:
    return Verdict(f"{module}:{status}:{by}:{before}", module, 1, before, "a >= 0", status, by, 1.0)


def test_the_table_counts_each_fate_and_scores_the_non_equivalent():
    entries = {("m.py", "a > 0", "a >= 0"): equivalent.Equivalent("m.py", "a > 0", "a >= 0", "never 0")}
    verdicts = [verdict("killed", "cpu case x: reference fail", "b"), verdict("killed", "test t", "c"),
                verdict("killed", "import: SyntaxError", "d"), verdict("timeout", "past 9 s", "e"),
                verdict("survived", "passed", "a > 0"), verdict("survived", "passed", "f")]
    (row,) = table.rows({"m.py": 8}, verdicts, entries)
    assert (row.mutants, row.judged, row.killed, row.by_cases, row.by_tests, row.timeout, row.equivalent,
            row.survived) == (8, 6, 3, 2, 1, 1, 1, 1)
    assert row.score == 3 / 4
    assert [v.before for v in table.survivors(verdicts, entries)] == ["f"]
    assert "| m.py | 8 | 6 | 3 (2 / 1) | 1 | 1 | 1 | 75.0% |" in table.render([row])


def test_a_listed_equivalent_that_is_killed_is_reported():
    entries = {("m.py", "a > 0", "a >= 0"): equivalent.Equivalent("m.py", "a > 0", "a >= 0", "never 0")}
    killed = verdict("killed", "cpu case x: reference fail")
    assert table.wrongly_listed([killed], entries) == [killed]
    assert table.wrongly_listed([verdict("survived")], entries) == []


@pytest.mark.parametrize("argv,message", [
    (["--modules", "cases/case.py"], "not a module file"),
    (["--modules", "optimizers/nothing.py"], "not a module file"),
    (["--budget-minutes", "0"], "--budget-minutes"),
    (["--timeout-base", "0"], "--timeout-base"),
    (["--jobs", "0"], "--jobs"),
    (["--map-tests", "tests/test_nothing.py"], "no test file"),
    (["--survivors-against", "tests/test_nothing.py"], "--survivors-against: no test file"),
    (["--survivors-against", "tests/test_defaults.py", "--report-only"], "not both"),
    (["--modules", "optimizers/norms.py", "--changed-since", "HEAD"], "not both"),
    (["--changed-since", "no-such-revision-anywhere"], "--changed-since"),
])
def test_bad_usage_is_refused_before_any_work(tmp_path, capsys, argv, message):
    session = tmp_path / "session"
    assert main(["--session", str(session), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not session.exists()


@pytest.mark.slow
def test_a_real_mutant_is_killed_and_the_original_survives_the_same_judges(tmp_path):
    """The end-to-end run below, in a fresh interpreter: its forked judges run pytest on the scratch copy,
    which a process that has already collected other test modules (an xdist worker of the whole suite)
    cannot do cleanly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"MUTATION_END_TO_END": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"{__file__}::test_a_real_mutant_end_to_end", "--basetemp", str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.skipif(os.environ.get("MUTATION_END_TO_END") != "1",
                    reason="run in a fresh interpreter by test_a_real_mutant_is_killed_and_the_original_survives_the_same_judges")
def test_a_real_mutant_end_to_end(tmp_path):
    """End to end through a forked judge on a scratch copy: NorMuon's default beta2 0.95 -> 1.95 (issue 31's
    survivor) is killed by the defaults test it leads with; the unmutated copy passes both tests (the control)."""
    module = "optimizers/algorithms/normuon.py"
    original = (ROOT / module).read_text()
    (mutant,) = [m for m in mutants(module, ROOT) if '"beta2": 1.95' in m.after]
    scratch = workers.Scratch(ROOT, tmp_path / "scratch")
    p = selection.Plan(tests=["tests/test_defaults.py::test_defaults_step_as_documented[normuon-lr only]"],
                       lead=["tests/test_defaults.py::test_defaults_step_as_documented[normuon-nothing]"])
    workers.preload()
    got = {}
    for name, source in (("mutant", mutant.source(original)), ("original", original)):
        scratch.write(module, source)
        out = tmp_path / f"{name}.json"
        child = workers.fork(scratch.path, tmp_path / f"{name}.log", 600.0, lambda out=out: judge.run(p, out), name)
        assert workers.reap([child])[1] == "exit 0", (tmp_path / f"{name}.log").read_text()[-3000:]
        got[name] = json.loads(out.read_text())
    assert got["mutant"] == {"status": "killed", "by": "test " + p.lead[0]}  # the lead runs first
    assert got["original"] == {"status": "survived", "by": ""}
    scratch.restore(module)
    assert (scratch.path / module).read_text() == original
    assert (ROOT / module).read_text() == original  # the worktree is never mutated


def test_a_judge_past_its_deadline_is_killed_with_its_group(tmp_path):
    import time
    child = workers.fork(tmp_path, tmp_path / "log", 0.5, lambda: time.sleep(60) or 0, None)
    start = time.monotonic()
    assert workers.reap([child], poll=0.05)[1] == "timeout"
    assert time.monotonic() - start < 10


POSTPONED = ("from __future__ import annotations\n\n"
             "def f(x: int | None, y: float = 1.0) -> int | str:\n    z: int | None = x\n    return x\n")


def test_a_mutant_of_postponed_annotations_alone_is_left_out():
    """Under `from __future__ import annotations` nothing evaluates an annotation: mutating one changes no input's
    result. Controls: the same edit where annotations are evaluated, an edit of code, and a default value."""
    def edited(text: str) -> str:
        return text.replace("int | None, y", "int + None, y").replace("-> int | str", "-> int & str")
    assert annotation_only(POSTPONED, edited(POSTPONED))
    assert annotation_only(POSTPONED, POSTPONED.replace("z: int | None", "z: int ^ None"))
    evaluated = POSTPONED.replace("from __future__ import annotations\n", "")
    assert not annotation_only(evaluated, edited(evaluated))
    assert not annotation_only(POSTPONED, POSTPONED.replace("return x", "return -x"))
    assert not annotation_only(POSTPONED, POSTPONED.replace("y: float = 1.0", "y: float = 2.0"))
    assert not annotation_only(POSTPONED, POSTPONED.replace("= x\n", "= +\n"))  # invalid code fails at import


def test_a_session_judges_one_state_of_a_module_and_reports_what_it_judged_after_a_change(tmp_path):
    """A module edited after the session made its mutants is refused for judging (ValueError) but its stored
    mutants are still reported (`stored`: what was judged, of the source it was made from)."""
    made = toy_mutants(tmp_path)
    session = Session(tmp_path / "session", tmp_path)
    assert session.mutants("pkg/toy.py") == made
    (tmp_path / "pkg" / "toy.py").write_text(TOY.replace("0.5", "0.25"))
    with pytest.raises(ValueError, match="changed since session"):
        session.mutants("pkg/toy.py")
    assert session.mutants("pkg/toy.py", stored=True) == made


def test_gloo_judges_cover_the_layouts_before_repeating_one():
    """spread: one case of each layout (scope and placement) before a second of any, each placement's first layout
    first, the placements most cases have first. The control: the plain even spacing of these ids picks no
    Shard(1) case."""
    ids = [f"dion2-f0.5-local/l{i}/seed0/shard0/ws2" for i in range(6)] + ["dion2-f0.5-local/l9/seed0/shard1/ws2",
                                                                          "dion2-f0.5-global/l9/seed0/shard0/ws2"]
    assert selection.spread(ids, 3) == [ids[0], ids[6], ids[7]]
    assert selection.spread(ids, 4) == [ids[0], ids[6], ids[7], ids[1]]
    assert selection.spread(ids, 2) == [ids[0], ids[6]]
    assert not any("shard1" in ids[i * len(ids) // 3] for i in range(3))
    assert selection.layout_of(ids[7]) == ("global", "shard0") and selection.layout_of("muon/a/ws2") == ("", "a")
    tier = [f"muon/{p}{i}/x/{p}/ws2" for p, n in [("tp0", 1), ("shard1", 2), ("tp1", 1), ("replicated", 3),
                                                  ("dp2tp0", 1), ("shard0", 4)] for i in range(n)]
    tier = [t.replace(f"/{t.split('/')[1]}/", "/a/") for t in tier]
    assert [selection.layout_of(t)[1] for t in selection.spread(tier, 4)] == ["shard0", "replicated", "shard1", "tp0"]


def test_survivors_are_judged_again_against_whole_test_files_and_the_run_resumes(tmp_path):
    """--survivors-against (the CUDA test files on a GPU machine, for lines only CUDA runs): a survivor the
    files kill becomes killed, one they pass keeps what it passed before, a reviewed equivalent is not judged,
    and a second run finds nothing left. Run in a fresh interpreter, as above."""
    module = "optimizers/algorithms/normuon.py"
    session = Session(tmp_path / "session", ROOT)
    made, listed = session.mutants(module), equivalent.load()
    killable = next(m for m in made if '"beta2": 1.95' in m.after)  # the defaults test kills it
    passing = next(m for m in made if "placement.dim" in m.before and m.signature not in listed)  # distributed code
    listed = next(m for m in made if m.signature in listed)
    for m in (killable, passing, listed):
        session.record(Verdict(m.key, m.module, m.line, m.before, m.after, "survived", "passed 3 cpu cases", 1.0))
    files = ["tests/test_defaults.py"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "benchmarks.mutation", "--session", str(session.path), "--modules",
                           module, "--survivors-against", *files, "--jobs", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = session.verdicts()
    assert got[killable.key].status == "killed" and "test_defaults" in got[killable.key].by
    assert got[killable.key].by.endswith("(a survivor judged again)")
    assert got[passing.key].status == "survived"
    assert got[passing.key].by == "passed 3 cpu cases; then passed tests/test_defaults.py"
    assert got[listed.key].by == "passed 3 cpu cases"
    assert "2 survivors to judge against 1 test files" in done.stderr
    import io
    log = io.StringIO()
    from benchmarks.mutation.session import Limits
    assert session.rejudge([module], files, set(equivalent.load()), 60.0, 1, Limits(), log)
    assert "0 survivors to judge" in log.getvalue() and session.verdicts() == got


CONTROL = """
import sys
from pathlib import Path
from benchmarks.mutation import workers
from benchmarks.mutation.selection import Plan
from benchmarks.mutation.session import Session
workers.preload()
session = Session(Path(sys.argv[1]) / "session", Path(sys.argv[1]) / "project")
try:
    session._control(Plan(tests=[sys.argv[2]]), 120.0, sys.stderr)
except RuntimeError as exc:
    print("refused:", exc)
else:
    print("passed")
"""


@pytest.mark.parametrize("body,want", [("assert True", "passed"), ("assert False", "refused: the judges fail")])
def test_survivors_are_judged_again_only_by_files_the_unmutated_code_passes(tmp_path, body, want):
    """--survivors-against first runs its files on an unmutated copy: a file failing there would kill every
    mutant, and is refused. A project of one test file, in a fresh interpreter."""
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_one.py").write_text(f"def test_one():\n    {body}\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-c", CONTROL, str(tmp_path), "tests/test_one.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith(want), done.stdout[-2000:] + done.stderr[-2000:]


THREADS = """
import os, sys
from benchmarks.mutation import workers
if sys.argv[1] == "one":
    workers.one_thread()
workers.preload()
import numpy as np
import torch
a = np.ones((600, 600))
a @ a
torch.ones(300, 300) @ torch.ones(300, 300)
print(len(os.listdir("/proc/self/task")), *(os.environ.get(v) for v in workers.ONE_THREAD))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2,
                    reason="counts a process's threads in /proc, which needs more than one core to differ")
def test_one_thread_holds_the_driver_and_its_judges_to_one_blas_thread():
    """The driver's BLAS and OpenMP pools are one thread where the caller set none (forked judges inherit them);
    after numpy or torch is imported it refuses, and sets nothing."""
    env = {k: v for k, v in os.environ.items() if k not in workers.ONE_THREAD}
    runs = {how: subprocess.run([sys.executable, "-c", THREADS, how], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=300) for how in ("one", "default")}
    (one, *one_vars), (default, *default_vars) = (runs[h].stdout.split() for h in ("one", "default"))
    assert one_vars == ["1"] * 3 and default_vars == ["None"] * 3
    assert int(one) < int(default), (one, default)
    import numpy  # noqa: F401 (the refusal's condition, in this test's process)

    before = {v: os.environ.get(v) for v in workers.ONE_THREAD}
    with pytest.raises(RuntimeError, match="before numpy or torch is imported"):
        workers.one_thread()
    assert {v: os.environ.get(v) for v in workers.ONE_THREAD} == before

"""The results table of a session: per module, its mutants and what became of them.

  mutants     made from the module
  judged      with a verdict
  killed      a judge failed (cpu: a harness case on one process; gloo: a distributed case;
              test: a unit test; import: the mutated code does not import)
  timeout     the judges ran past the mutant's deadline (counted apart, not as killed)
  equivalent  survived, and on the reviewed list (equivalent.toml)
  survived    survived and not on the list: a gap to close or a mutant to review
  score       killed / (killed + survived): the share of the non-equivalent mutants judged in
              time that a judge kills
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.mutation.equivalent import Equivalent
from benchmarks.mutation.session import Verdict


@dataclass(frozen=True)
class Row:
    module: str
    mutants: int
    judged: int
    killed: int
    by_cases: int
    by_tests: int
    timeout: int
    equivalent: int
    survived: int
    seconds: float

    @property
    def score(self) -> float | None:
        whole = self.killed + self.survived
        return self.killed / whole if whole else None


def kind(by: str) -> str:
    """What kind of judge killed a mutant, from its verdict's `by`."""
    return by.split(" ", 1)[0].rstrip(":")


def rows(counts: dict[str, int], verdicts: list[Verdict], equivalents: dict[tuple, Equivalent]) -> list[Row]:
    """One row per module of `counts` (module -> mutants made), in its order."""
    out = []
    for module, made in counts.items():
        mine = [v for v in verdicts if v.module == module]
        killed = [v for v in mine if v.status == "killed"]
        alive = [v for v in mine if v.status == "survived"]
        equivalent = [v for v in alive if (v.module, v.before, v.after) in equivalents]
        out.append(Row(module, made, len(mine), len(killed),
                       sum(kind(v.by) in ("cpu", "gloo", "import") for v in killed),
                       sum(kind(v.by) == "test" for v in killed),
                       sum(v.status == "timeout" for v in mine), len(equivalent), len(alive) - len(equivalent),
                       sum(v.seconds for v in mine)))
    return out


def render(table: list[Row]) -> str:
    """A markdown table, with a total row."""
    lines = ["| module | mutants | judged | killed (harness / tests) | timeout | equivalent | survived | score | "
             "time |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def fmt(r: Row) -> str:
        score = "-" if r.score is None else f"{100 * r.score:.1f}%"
        return (f"| {r.module} | {r.mutants} | {r.judged} | {r.killed} ({r.by_cases} / {r.by_tests}) | {r.timeout} | "
                f"{r.equivalent} | {r.survived} | {score} | {r.seconds / 60:.1f} min |")

    lines += [fmt(r) for r in table]
    if len(table) > 1:
        total = Row("total", *(sum(getattr(r, f) for r in table) for f in
                               ("mutants", "judged", "killed", "by_cases", "by_tests", "timeout", "equivalent",
                                "survived", "seconds")))
        lines.append(fmt(total))
    return "\n".join(lines)


def survivors(verdicts: list[Verdict], equivalents: dict[tuple, Equivalent]) -> list[Verdict]:
    """Survivors not on the reviewed list, by module and line."""
    return sorted((v for v in verdicts if v.status == "survived" and (v.module, v.before, v.after) not in equivalents),
                  key=lambda v: (v.module, v.line, v.key))


def wrongly_listed(verdicts: list[Verdict], equivalents: dict[tuple, Equivalent]) -> list[Verdict]:
    """Mutants on the reviewed list that a judge killed: the entry's reason is wrong."""
    return [v for v in verdicts if v.status == "killed" and (v.module, v.before, v.after) in equivalents]

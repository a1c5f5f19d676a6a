"""The nightly multi-GPU run: the nightly tier on NCCL under torchrun, the same cases on gloo, their
diff, wall time per world size and case-checks per GPU-hour, all stored in one folder.

    python benchmarks/nightly_multi_gpu.py --budget 540 [--gpus N] [--world-sizes 2,4] [--select S ...]

For each world size w (default: every distributed world size of the tier up to N, the GPUs
visible), in ascending order, one launch per backend:

  nccl  torchrun --standalone --nproc-per-node w -m harness run --backend nccl --tier T --select /ws<w>
  gloo  python -m harness run --backend gloo --tier T --select ...      (spawned pools of CPU ranks: the
        cases split over `--cpu-jobs` such processes side by side, merged into one stored run)
  diff  python -m harness diff <gloo run> <nccl run>                    (paired case by case)

World size 1 (`--world-sizes 1,...`) runs the single-process cases on `cuda` against `cpu`.
The launches run one after another, each alone on the machine, so each one's wall time is its
own; a launch's wall time includes its process start, imports and process-group setup.

Budget: no launch starts after `--budget` seconds, and a running launch is stopped (SIGTERM to its
process group, so the harness writes the cases it finished, marked incomplete; SIGKILL after
`KILL_GRACE` s) when the budget runs out, `RESERVE` s before it ends, to leave time for the
files. What ran is written either way.

Outputs, in benchmarks/results/<date>-<gpu kind>x<gpus>-torch<version>-ws<gpus>/ (`--results` to move it; a
folder of that name already there is kept, and this run takes the name with -2, -3, ...):
  runs/<backend>-ws<w>/    the stored run of each launch (results.parquet, summary.md, run.json, ...);
                           a split CPU twin's parts beside it, runs/gloo-ws<w>-part<j>/
  logs/<backend>-ws<w>.log each launch's stdout and stderr, whole (-part<j>.log per part)
  diffs/ws<w>/             diff.md, diff.html of gloo vs nccl (cpu vs cuda at w = 1)
  all/                     every record of every launch, as one stored run (`harness diff` reads it)
  timings.json             per launch: command, exit status, wall seconds, checks, whether it was cut
  summary.md               the table printed on stdout, then the failing checks
When $OUT is set, the whole folder also goes into ONE tarball $OUT/<folder name>.tar.gz (a device
machine returns only a few files). stdout gets a compact summary only; logs hold the rest.
Exit status: 0 when it stored results (failing checks are in summary.md and the diffs), 1 when no
launch stored any, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from cases import Case  # noqa: E402
from harness.apps import cli  # noqa: E402
from harness.running.selection import select  # noqa: E402
from reports import Record, RunInfo, load_run, render_markdown, save_run, status_counts  # noqa: E402

PAIRS = {True: ("nccl", "gloo"), False: ("cuda", "cpu")}
"""(judged backend, its CPU twin) for distributed (True) and single-process (False) cases."""
RESERVE = 20.0
"""Seconds kept at the end of the budget for the diffs, the merged files and the tarball."""
KILL_GRACE = 15.0
"""Seconds a stopped launch gets to write what it finished before SIGKILL."""
MAX_CPU_JOBS = 8
"""At most this many processes share a CPU twin's cases (each a parent and w gloo ranks)."""
TARBALL_LIMIT = 15 * 2 ** 20
"""Bytes: a device machine returns files up to 16 MiB; above this the HTML reports are left out."""
clock: Callable[[], float] = time.monotonic
"""The driver's clock (seconds); tests replace it."""


@dataclass
class Part:
    """One process of a launch: its command, where it stores its run, its log, its exit status."""

    command: list[str]
    out: Path
    log: Path
    returncode: int | None = None


@dataclass
class Launch:
    """One backend at one world size: its parts (one process, or the CPU twin's cases split over
    several processes run side by side and merged into `out`), and what became of it."""

    world_size: int
    backend: str
    out: Path
    parts: list[Part]
    selection: list[str]
    """The --select patterns of the whole launch (the same for both backends of a world size)."""
    seconds: float = 0.0
    cut: bool = False
    """Stopped by the budget (SIGTERM/SIGKILL), or never started."""
    started: bool = False
    checks: int = 0
    """Checks that ran (pass, fail or error)."""
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.backend}-ws{self.world_size}"

    @property
    def returncode(self) -> int | None:
        """The first nonzero exit status of its parts, else 0 (None before it ran)."""
        codes = [p.returncode for p in self.parts]
        if any(c is None for c in codes):
            return None
        return next((c for c in codes if c), 0)


def gpu_kind() -> str:
    """'nvidia-h200'-style name of GPU 0, or 'cpu' without CUDA."""
    if not torch.cuda.is_available():
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")


def result_folder(results: Path, gpus: int, when: datetime.date) -> Path:
    """results/<date>-<gpu kind>x<gpus>-torch<version>-ws<gpus>, named
    like the device kind that ran it (nvidia-h200x4: four H200s)."""
    version = torch.__version__.split("+")[0]
    return results / f"{when.isoformat()}-{gpu_kind()}x{gpus}-torch{version}-ws{gpus}"


def free_name(folder: Path) -> Path:
    """`folder`, or the first of folder-2, folder-3, ... that does not exist."""
    n, free = 1, folder
    while free.exists():
        n += 1
        free = folder.with_name(f"{folder.name}-{n}")
    return free


def selection(tier: str, w: int, patterns: list[str]) -> tuple[list[Case], list[str]]:
    """The cases of world size `w` in `tier` (narrowed by `patterns`), and the --select patterns that
    choose exactly them for `harness run`: `/ws<w>` for a whole world size, else their ids (run's
    patterns are OR-ed, so "these patterns AND world size w" is spelled out). At w = 1 the backend
    (cuda, cpu) leaves out the distributed cases, so `patterns` themselves do."""
    cases = [c for c in select(tier, patterns) if c.world_size == w]
    if w == 1 or not cases:
        return cases, list(patterns)
    if not patterns and all(c.world_size == w for c in select(tier, [f"/ws{w}"])):
        return cases, [f"/ws{w}"]
    return cases, [c.id for c in cases]


def plan(tier: str, world_sizes: list[int], patterns: list[str], folder: Path, cpu_jobs: int | None = None
         ) -> list[Launch]:
    """The launches, world size by world size: the judged backend (one torchrun, or one cuda process),
    then its CPU twin split over `cpu_jobs` processes (default: what the cores hold, w + 1 each)."""
    launches = []
    for w in world_sizes:
        cases, chosen = selection(tier, w, patterns)
        if not cases:
            continue
        for backend in PAIRS[w > 1]:
            out = folder / "runs" / f"{backend}-ws{w}"
            log = folder / "logs" / f"{backend}-ws{w}.log"
            jobs = 1 if backend in ("nccl", "cuda") else (
                cpu_jobs or max(1, min(MAX_CPU_JOBS, (os.cpu_count() or 1) // (w + 1))))
            chunks = [chunk for chunk in ([c.id for c in cases[j::jobs]] for j in range(jobs)) if chunk]
            if len(chunks) <= 1:
                parts = [Part(_command(backend, tier, chosen, out, w), out, log)]
            else:
                parts = [Part(_command(backend, tier, chunk, out.with_name(f"{out.name}-part{j}"), w),
                              out.with_name(f"{out.name}-part{j}"), log.with_name(f"{backend}-ws{w}-part{j}.log"))
                         for j, chunk in enumerate(chunks)]
            launches.append(Launch(w, backend, out, parts, chosen))
    return launches


def _command(backend: str, tier: str, patterns: list[str], out: Path, w: int) -> list[str]:
    harness = ["-m", "harness", "run", "--backend", backend, "--tier", tier,
               *[a for p in patterns for a in ("--select", p)], "--out", str(out)]
    if backend == "nccl":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(w), *harness]
    return [sys.executable, *harness]


def execute(launch: Launch, deadline: float) -> None:
    """Run the parts of `launch` side by side, each in its own process group, its output into its
    log; stop them at `deadline` (SIGTERM, then SIGKILL after KILL_GRACE)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    start = clock()
    launch.started = True
    running = []
    for part in launch.parts:
        part.log.parent.mkdir(parents=True, exist_ok=True)
        log = open(part.log, "w")
        log.write("$ " + shlex.join(part.command) + "\n")
        log.flush()
        running.append((part, log, subprocess.Popen(part.command, cwd=ROOT, env=env, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)))
    for part, log, proc in running:
        try:
            part.returncode = proc.wait(timeout=max(0.0, deadline - clock()))
        except subprocess.TimeoutExpired:
            launch.cut = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                part.returncode = proc.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                part.returncode = proc.wait()
        log.close()
    launch.seconds = clock() - start


def merge(launch: Launch) -> None:
    """Store the records of a split launch's parts as one run in `launch.out`, selected as the whole
    launch (so that it diffs against the other backend's run); incomplete if any part is."""
    records, contexts = [], []
    for part in launch.parts:
        try:
            got, ctx = load_run(part.out)
        except ValueError:
            continue
        records += got
        contexts.append(ctx)
    if not contexts:
        return
    stopped = [f"part {p.out.name}: {c.get('interrupted') or 'not stored'}" for p, c in zip(launch.parts, contexts)
               if not c.get("complete", True)]
    stopped += [f"part {p.out.name}: not stored" for p in launch.parts if not (p.out / "run.json").exists()]
    info = RunInfo(target=str(contexts[0].get("target", "ours")), tier=str(contexts[0].get("tier", "")),
                   backends=launch.backend, command=" & ".join(shlex.join(p.command) for p in launch.parts),
                   started=str(contexts[0].get("started", "")), seconds=launch.seconds,
                   torch_version=torch.__version__, selection=tuple(launch.selection),
                   interrupted="; ".join(stopped))
    save_run(records, info, launch.out)
    (launch.out / "summary.md").write_text(render_markdown(records, info))


def collect(launch: Launch) -> list[Record]:
    """The records the launch stored, its parts merged first (none if it stored no run)."""
    if len(launch.parts) > 1:
        merge(launch)
    try:
        records, _ = load_run(launch.out)
    except ValueError:
        return []
    launch.counts = status_counts(records)
    launch.checks = sum(launch.counts.get(s, 0) for s in ("pass", "fail", "error"))
    return records


def diff_pairs(launches: list[Launch], folder: Path) -> dict[int, str]:
    """`harness diff` of the CPU twin (base) against the judged backend (head), per world size where
    both stored a run; the verdict line of each."""
    verdicts = {}
    by_w: dict[int, dict[str, Launch]] = {}
    for launch in launches:
        by_w.setdefault(launch.world_size, {})[launch.backend] = launch
    for w, runs in sorted(by_w.items()):
        judged, twin = (runs.get(b) for b in PAIRS[w > 1])
        if judged is None or twin is None or not (judged.out / "run.json").exists() \
                or not (twin.out / "run.json").exists():
            continue
        out = folder / "diffs" / f"ws{w}"
        said = io.StringIO()
        with contextlib.redirect_stderr(said):  # --force: a run cut by the budget is still diffed
            code = cli.main(["diff", str(twin.out), str(judged.out), "--out", str(out), "--force"])
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        verdicts[w] = lines[-1] if lines else f"diff exited {code}"
    return verdicts


def rates(launches: list[Launch], gpus: int) -> list[dict]:
    """Per launch: wall seconds, checks, checks per hour of the machine's `gpus` GPUs and of the w GPUs
    the launch used (GPU launches only)."""
    rows = []
    for launch in launches:
        hours = launch.seconds / 3600.0
        gpu = launch.backend in ("nccl", "cuda")
        used = launch.world_size if gpu else 0
        rows.append(dict(name=launch.name, world_size=launch.world_size, backend=launch.backend,
                         started=launch.started, cut=launch.cut, returncode=launch.returncode,
                         seconds=round(launch.seconds, 1), checks=launch.checks, counts=launch.counts,
                         checks_per_gpu_hour_machine=round(launch.checks / (hours * gpus)) if gpu and hours else None,
                         checks_per_gpu_hour_used=round(launch.checks / (hours * used)) if gpu and hours else None,
                         command=" & ".join(shlex.join(p.command) for p in launch.parts)))
    return rows


def summary(rows: list[dict], verdicts: dict[int, str], folder: Path, gpus: int, budget: float,
            elapsed: float) -> str:
    """The compact summary: one line per launch, the diffs, the totals."""
    lines = [f"nightly multi-GPU: {folder.name}  ({gpus} GPUs, budget {budget:g}s, used {elapsed:.0f}s)",
             "| launch | exit | wall s | checks | fail | error | pass | skipped | unsupported | checks/GPU-h (machine) "
             "| checks/GPU-h (used) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["counts"]
        note = "not started (budget)" if not r["started"] else ("CUT by the budget" if r["cut"] else "")
        lines.append(f"| {r['name']} | {r['returncode']} | {r['seconds']} | {r['checks']} | {c.get('fail', 0)} "
                     f"| {c.get('error', 0)} | {c.get('pass', 0)} | {c.get('skipped', 0)} | {c.get('unsupported', 0)} "
                     f"| {r['checks_per_gpu_hour_machine'] or ''} | {r['checks_per_gpu_hour_used'] or ''} | {note} |")
    gpu_rows = [r for r in rows if r["backend"] in ("nccl", "cuda") and r["started"]]
    seconds = sum(r["seconds"] for r in gpu_rows)
    checks = sum(r["checks"] for r in gpu_rows)
    if seconds:
        lines.append(f"GPU launches: {checks} checks in {seconds:.0f}s on {gpus} GPUs = "
                     f"{checks / (seconds / 3600 * gpus):.0f} checks per GPU-hour (machine)")
    for w, verdict in sorted(verdicts.items()):
        lines.append(f"diff ws{w} ({'gloo -> nccl' if w > 1 else 'cpu -> cuda'}): {verdict}")
    return "\n".join(lines) + "\n"


def tarball(folder: Path, out_dir: Path) -> Path:
    """ONE tarball of `folder` in `out_dir`; without the HTML reports when it would exceed TARBALL_LIMIT."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{folder.name}.tar.gz"
    for keep_html in (True, False):
        with tarfile.open(path, "w:gz") as tar:
            tar.add(folder, arcname=folder.name,
                    filter=lambda info: None if not keep_html and info.name.endswith(".html") else info)
        if path.stat().st_size <= TARBALL_LIMIT:
            break
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, required=True, help="seconds the whole run may take")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all visible)")
    parser.add_argument("--world-sizes", default=None,
                        help="comma-separated world sizes (default: the tier's distributed ones up to --gpus); "
                             "1 = the single-process cases on cuda vs cpu")
    parser.add_argument("--tier", default="nightly")
    parser.add_argument("--select", action="append", default=[], help="narrow the cases (substring of the id)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--cpu-jobs", type=int, default=None,
                        help=f"processes sharing the CPU twin's cases (default: cores // (w + 1), at most {MAX_CPU_JOBS})")
    args = parser.parse_args(argv)
    t0 = clock()
    deadline = t0 + args.budget - RESERVE
    if args.budget <= RESERVE:
        parser.error(f"--budget must exceed the {RESERVE:g}s reserved for writing the results")
    gpus = args.gpus if args.gpus is not None else torch.cuda.device_count()
    if args.world_sizes:
        world_sizes = sorted({int(w) for w in args.world_sizes.split(",")})
    else:
        world_sizes = sorted({c.world_size for c in select(args.tier, args.select)
                              if 1 < c.world_size <= max(gpus, 1)})
    folder = result_folder(args.results, gpus, datetime.datetime.now(datetime.timezone.utc).date())
    folder = free_name(folder)  # stored results are never overwritten: a second run of the day gets -2, -3, ...
    launches = plan(args.tier, world_sizes, args.select, folder, args.cpu_jobs)
    if not launches:
        parser.error(f"no case of tier {args.tier!r} at world sizes {world_sizes} matches the selection")
    folder.mkdir(parents=True)
    records: list[Record] = []
    for launch in launches:
        if clock() >= deadline:
            launch.cut = True
            continue
        execute(launch, deadline)
        records += collect(launch)
        print(f"{launch.name}: exit {launch.returncode}, {launch.seconds:.0f}s, {launch.checks} checks"
              + (" (CUT by the budget)" if launch.cut else ""), flush=True)
    verdicts = diff_pairs(launches, folder)
    rows = rates(launches, gpus)
    elapsed = clock() - t0
    text = summary(rows, verdicts, folder, gpus, args.budget, elapsed)
    if records:
        info = RunInfo(target="ours", tier=args.tier, backends=",".join(sorted({r.backend for r in records})),
                       command=shlex.join([sys.executable, *sys.argv]),
                       started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       seconds=elapsed, torch_version=torch.__version__, selection=tuple(args.select),
                       interrupted="" if not any(x.cut for x in launches) else "the budget cut a launch")
        save_run(records, info, folder / "all")  # a stored run is a folder of its own
        failing = render_markdown(records, info)
    else:
        failing = "no launch stored a run\n"
    (folder / "timings.json").write_text(json.dumps(dict(gpus=gpus, gpu_kind=gpu_kind(), torch=torch.__version__,
                                                         budget=args.budget, elapsed=elapsed, launches=rows,
                                                         diffs={str(k): v for k, v in verdicts.items()}), indent=1))
    (folder / "summary.md").write_text(text + "\n" + failing)
    print(text, end="")
    if os.environ.get("OUT"):
        print(f"tarball: {tarball(folder, Path(os.environ['OUT']))}")
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())

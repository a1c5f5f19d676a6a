"""How soon a `python -m harness run --jobs 2` ends after a fault (issue 30 item 1), measured from outside:

  death    both cases' targets kill their worker (os._exit(3)) at their first step, each writing the time
           first; seconds from the later death until the run's process has exited, its run stored
  sigterm  both cases' targets hang; once both workers print that they hang, SIGTERM to the process
           group; seconds until the run's process has exited, its (empty, incomplete) run stored

Each is run --repeat times; prints every time and the median. The run's process is this checkout's
harness (PYTHONPATH = the repository root), the targets a module written to a temporary directory.
Usage: python benchmarks/fault_reaction.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("muon/linear-12x20/mb2/noflat/fp32@bf16/pe/rms_norm/plain/wd0/steps3/gaussian/seed0",
         "muon/linear-12x20/mb2/noflat/fp32@bf16/gns/spectral_norm/nesterov/wd0.1/steps1/gaussian/seed0")
TARGETS = '''
import os
import time
from pathlib import Path

from harness.targets.ours import OursMuon


class Dies(OursMuon):
    def run(self, params, grads, case):
        Path(os.environ["DEATHS"], str(os.getpid())).write_text(repr(time.time()))
        os._exit(3)


class Hangs(OursMuon):
    def run(self, params, grads, case):
        print("hanging", flush=True)
        while True:
            time.sleep(1)


def dies():
    return Dies()


def hangs():
    return Hangs()
'''


def _start(work: Path, target: str) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(work), "DEATHS": str(work), "PYTHONPATH": f"{ROOT}{os.pathsep}{work}"}
    selection = [arg for case in CASES for arg in ("--select", case)]
    return subprocess.Popen([sys.executable, "-m", "harness", "run", *selection, "--jobs", "2", "--quiet",
                             "--target", f"reaction_targets:{target}", "--out", str(work / "out")],
                            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def after_death(work: Path) -> float:
    proc = _start(work, "dies")
    proc.wait(timeout=1800)
    ended = time.time()
    deaths = [float(p.read_text()) for p in work.iterdir() if p.name.isdigit()]
    assert proc.returncode == 1 and len(deaths) == 2 and (work / "out" / "run.json").exists(), proc.returncode
    return ended - max(deaths)


def after_sigterm(work: Path) -> float:
    proc = _start(work, "hangs")
    deadline = time.monotonic() + 1800
    while sum("hanging" in log.read_text() for log in work.glob("caseworkers-*/worker*.log")) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the workers never hung"
        time.sleep(0.2)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=600)
    seconds = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGTERM and (work / "out" / "run.json").exists(), proc.returncode
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name, measure in (("death", after_death), ("sigterm", after_sigterm)):
        times = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as work:
                Path(work, "reaction_targets.py").write_text(textwrap.dedent(TARGETS))
                times.append(measure(Path(work)))
        print(f"{name:8} ended {statistics.median(times):.2f}s after the fault (median of {len(times)}: "
              f"{', '.join(f'{t:.2f}' for t in times)})", flush=True)


if __name__ == "__main__":
    main()

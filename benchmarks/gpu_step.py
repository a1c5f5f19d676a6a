"""Median optimizer step time of our Muon (each orthogonalizer, each lever) beside peers, on three sets.

    python benchmarks/gpu_step.py [--sets gpt2_small,convnext_t,llama24] [--only REGEX] [--steps 10]
                                  [--budget 4] [--timeout 45] [--deadline 215] [--device cuda] [--scale 1]
                                  [--drop REGEX] [--extra-peers] [--quick]

Prints Markdown rows as each is measured (flushed): median step ms (CUDA events; host clock on CPU),
the first step's wall time including construction (compilation and autotuning included; the persistent
symmetric kernel compiles in the background after it, its stand-in running meanwhile, and the timed steps
wait for it), the standard Newton–Schulz TFLOP of one step, and the rate that equals against a measured dense bf16
matmul peak ("NS-equivalent": a contender doing fewer FLOPs, e.g. Gram NS, can pass 100%).

Bounded, so that one call of a few minutes yields the whole table:
  - per contender, timed steps = clamp(budget / (one step's time), 3, --steps), warm-up likewise;
  - per contender, `--timeout` seconds for construction, first step and measurement (SIGALRM): a peer
    still compiling says so in its cell;
  - for the whole run, `--deadline` seconds: what is left is printed as skipped;
  - ours and torch.optim.Muon on every set first, then the peers (dion, gram-newton-schulz), each row
    in a process of its own (so one peer's torch.compile caches and recompile counts never reach the
    next set), with torch._dynamo's recompile limit raised to RECOMPILE_LIMIT as dion's own scripts do;
  - `--only REGEX` keeps the contenders whose label matches; `--drop REGEX` leaves out those whose
    "SET/LABEL" matches (a peer too slow to compile on one set, say, kept on the others).
Rows of ours, by the public options (optimizers/muon.py's Args): "ours (X)" is the default, no option set
(on CUDA with triton installed, fused=None takes the Triton kernels where they are faster: symmetric products
of symmetric.TRITON_ROWS rows or more, elementwise launches of elementwise.MIN_NUMEL elements or more;
optimizers/kernels.py; cuda_graphs=None captures the stacks of up to graphs.MAX_NUMEL elements, optimizers/graphs.py);
"fused=False" never takes the kernels (the torch passes and cuBLAS products), "fused=True" at every size (without
triton the row says so); "no graphs" sets cuda_graphs=False, "cuda graphs" cuda_graphs=True (every stack);
"variant tma" runs the default under `symmetric_triton.variant("tma")` (the kernel variant before
"persistent"); "lever 2 off" runs the same orthogonalizer with fused=False, no graphs and plain products instead of
symmetric products by halves (optimizers/symmetric.py): "ours (polar_express), lever 2 off" is the step as it was
before the levers; "ours (gram_newton_schulz)" against "ours (polar_express)" is lever 1 (Gram NS on the
rectangular matrices). Lever 4 (the cached, validated plan) is in every row of ours. A cell notes the optimizer's
`stats`: Gram NS matrices and fallbacks, Triton products. A summary per set closes the run: our best against the
fastest peer, each with its first step, and the goals of the default and the fastest step.
Peers run when installed: torch.optim.Muon (2-D only), dion's Muon (`dion`; convolutions handed to it as
their 2-D matrices, `as_2d`, since its own `flatten=True` is wrong), dion's Muon eager under its
CudaGraphOptimizer (`dion + cuda graphs`), the gram-newton-schulz package's Muon with its CuTe kernels
when `quack` is installed, else with its pure-torch path (`ns_use_kernels=False`); `--extra-peers` adds
dion with `use_triton=True` and, with `quack`, the gram-newton-schulz package without kernels.
`--scale` shrinks every dim; `--quick` is a CPU smoke run of the whole table in seconds (scale 0.005,
3 steps, no warm-up).
"""


from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import json
import os
import math
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

import optimizers
from optimizers import kernels, launches, symmetric


def gpt2_small(s: float) -> list[tuple[int, ...]]:
    """GPT-2 small: 12 layers of c_attn, c_proj, c_fc, mlp c_proj (48 matrices)."""
    d = _dim(768, s)
    return [shape for _ in range(12) for shape in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))]


def llama24(s: float) -> list[tuple[int, ...]]:
    """24 layers of q, k, v, o (4096 x 4096), gate, up (11008 x 4096), down (4096 x 11008): 168 matrices."""
    d, f = _dim(4096, s), _dim(11008, s)
    return [shape for _ in range(24) for shape in ((d, d),) * 4 + ((f, d), (f, d), (d, f))]


def convnext_t(s: float) -> list[tuple[int, ...]]:
    """ConvNeXt-T's weights: stem 4x4 conv, per block a 7x7 depthwise conv and two pointwise linears,
    2x2 downsampling convs, and the classifier (depths 3, 3, 9, 3; widths 96, 192, 384, 768)."""
    widths = [_dim(w, s) for w in (96, 192, 384, 768)]
    shapes: list[tuple[int, ...]] = [(widths[0], 3, 4, 4)]
    for stage, (depth, w) in enumerate(zip((3, 3, 9, 3), widths)):
        if stage:
            shapes.append((w, widths[stage - 1], 2, 2))
        shapes += [shape for _ in range(depth) for shape in ((w, 1, 7, 7), (4 * w, w), (w, 4 * w))]
    return shapes + [(1000, widths[-1])]


SETS: dict[str, Callable[[float], list[tuple[int, ...]]]] = {
    "gpt2_small": gpt2_small, "convnext_t": convnext_t, "llama24": llama24}

DEFAULT_GOALS_MS = {"gpt2_small": 4.5, "convnext_t": 8.0, "llama24": 540.0}
"""Median step goals of the default step, no option set ("ours (polar_express)"); and its first step within
FIRST_STEP_GOAL_S."""
FASTEST_GOALS_MS = {"gpt2_small": 3.2, "convnext_t": 2.8, "llama24": 420.0}
"""Median step goals of our fastest configuration (any row of ours)."""
FIRST_STEP_GOAL_S = 3.0
DEFAULT = "ours (polar_express)"
"""The row of the default step: Muon(flatten=True), no option set."""


def _dim(n: int, s: float) -> int:
    return max(2, int(round(n * s)))


def ns_tflop(shapes: list[tuple[int, ...]], steps: int = 5) -> float:
    """TFLOP of `steps` standard Newton–Schulz steps on every flattened matrix: 4 m^2 n + 2 m^3 per step."""
    total = 0.0
    for shape in shapes:
        m, n = sorted((shape[0], math.prod(shape[1:])))
        total += steps * (4 * m * m * n + 2 * m**3)
    return total / 1e12


def matmul_peak(device: torch.device) -> float:
    """Measured dense bf16 matmul TFLOP/s (8192^3, median of 10 after 3 warm-ups; CUDA only)."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    ms = statistics.median(_times_ms(lambda: a @ b, 3, 10, device))
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _times_ms(fn: Callable[[], object], warmup: int, steps: int, device: torch.device) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


@contextlib.contextmanager
def _plain_products() -> Iterator[None]:
    """Lever 2 off: every symmetric product as one plain product."""
    saved = symmetric.BLOCK
    symmetric.BLOCK = 1 << 62
    try:
        yield
    finally:
        symmetric.BLOCK = saved


@dataclass
class Contender:
    """A row: `make(params)` builds the optimizer (None: cannot run, `reason` says why), inside `context`;
    `peer`: someone else's optimizer, measured after ours, each set in a process of its own (its
    compilation caches and limits, and any state it leaves, die with that process)."""

    label: str
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None
    peer: bool
    reason: str = ""
    context: Callable[[], contextlib.AbstractContextManager] = field(default=contextlib.nullcontext)


RECOMPILE_LIMIT = 100
"""torch._dynamo's recompile limit in a peer's process: dion's own training script and benchmarks
raise it to 100 (`cache_size_limit`, the older name), since its compiled update is specialised per
matrix shape and a set of many shapes exceeds torch's default of 8."""


def raise_recompile_limit() -> None:
    """Set torch._dynamo's recompile limit to RECOMPILE_LIMIT (both names torch has used)."""
    import torch._dynamo.config as dynamo  # noqa: PLC0415 - only a peer's process needs it
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, RECOMPILE_LIMIT)


@contextlib.contextmanager
def _eager() -> Iterator[None]:
    """torch.compile off (dion's CUDA-graph wrapper asks for it: the graph already removes dispatch)."""
    with torch.compiler.set_stance("force_eager"):
        yield


def contenders(has_convs: bool, extra_peers: bool) -> list[Contender]:
    """Ours first (each orthogonalizer at its defaults, then CUDA graphs, then each `fused` choice, a kernel
    variant, the lever-off rows), then the peers: dion's Muon (compiled, and eager under its
    CudaGraphOptimizer), the gram-newton-schulz package's Muon (its CuTe kernels when `quack` is installed,
    else its pure-torch path). `extra_peers` adds dion + triton and, with `quack`, the gram-newton-schulz
    package without kernels."""
    def ours(orth: str, **options: object) -> Callable:
        return lambda ps: optimizers.Muon(ps, flatten=True, orthogonalizer=orth, **options)

    triton = kernels.available()
    missing = "" if triton else "triton not installed"
    polynomials = ("polar_express", "gram_newton_schulz")
    out = [Contender(f"ours ({orth})", ours(orth), False)
           for orth in ("polar_express", "newton_schulz", "gram_newton_schulz")]
    out.append(Contender("ours (gram_newton_schulz, fp16)",
                         ours("gram_newton_schulz", compute_dtype=torch.float16), False))
    out += [Contender(f"ours ({orth}, cuda graphs)", ours(orth, cuda_graphs=True), False)
            for orth in ("polar_express", "newton_schulz", "gram_newton_schulz")]
    out += [Contender(f"ours ({orth}, fused=True)", ours(orth, fused=True) if triton else None, False, missing)
            for orth in polynomials]
    out += [Contender(f"ours ({orth}, cuda graphs, fused=True)", ours(orth, cuda_graphs=True, fused=True)
                      if triton else None, False, missing) for orth in polynomials]
    out += [Contender(f"ours ({orth}, no graphs)", ours(orth, cuda_graphs=False), False) for orth in polynomials]
    out += [Contender(f"ours ({orth}, fused=False, no graphs)", ours(orth, fused=False, cuda_graphs=False), False)
            for orth in polynomials]
    out += [Contender(f"ours ({orth}, cuda graphs, fused=False)", ours(orth, cuda_graphs=True, fused=False), False)
            for orth in polynomials]
    kernel = symmetric.triton_kernel()
    out.append(Contender("ours (gram_newton_schulz, variant tma)", ours("gram_newton_schulz") if kernel else None,
                         False, missing, context=lambda: kernel.variant("tma")))
    out += [Contender(f"ours ({orth}), lever 2 off", ours(orth, fused=False, cuda_graphs=False), False,
                      context=_plain_products)
            for orth in polynomials]
    if not hasattr(torch.optim, "Muon"):
        out.append(Contender("torch.optim.Muon", None, False, f"not in torch {torch.__version__}"))
    elif has_convs:
        out.append(Contender("torch.optim.Muon", None, False, "rejects convs (2-D only)"))
    else:
        out.append(Contender("torch.optim.Muon", lambda ps: torch.optim.Muon(ps), False))
    try:
        from dion import Muon as DionMuon  # noqa: PLC0415 - optional peer
        out.append(Contender("dion", lambda ps: DionMuon(as_2d(ps)), True))
        try:
            from dion.cuda_graph import CudaGraphOptimizer  # noqa: PLC0415 - newer dion only
            out.append(Contender("dion + cuda graphs", lambda ps: CudaGraphOptimizer(
                DionMuon(as_2d(ps)), warmup_steps=2), True, context=_eager))
        except ImportError as exc:
            out.append(Contender("dion + cuda graphs", None, True, f"not in this dion ({exc.name})"))
        if extra_peers:
            out.append(Contender("dion + triton", lambda ps: DionMuon(as_2d(ps), use_triton=True), True))
    except ImportError as exc:
        out.append(Contender("dion", None, True, f"not installed ({exc.name})"))
    try:
        from gram_newton_schulz import Muon as GramMuon  # noqa: PLC0415 - optional peer

        def gram_package(kernels: bool) -> Callable:
            def make(ps: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
                with contextlib.redirect_stdout(io.StringIO()):  # its restart auto-tuning prints progress
                    return GramMuon(ps, ns_use_kernels=kernels)
            return make

        if importlib.util.find_spec("quack") is not None:
            out.append(Contender("gram-newton-schulz (kernels)", gram_package(True), True))
            if extra_peers:
                out.append(Contender("gram-newton-schulz (torch)", gram_package(False), True))
        else:  # its kernels import quack when built: without it, its own pure-torch path
            out.append(Contender("gram-newton-schulz (torch, no quack)", gram_package(False), True))
    except ImportError as exc:
        out.append(Contender("gram-newton-schulz", None, True, f"not installed ({exc.name})"))
    return out


def as_2d(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """Each parameter as its [out, prod(rest)] matrix (a view of the same memory, its gradient likewise): how
    dion's Muon is handed convolutions. Its own `flatten=True` flattens a whole megabatch [N, *shape] into one
    N x prod(shape) matrix (megabatch_base.muon_update_newton_schulz, `X.flatten(start_dim=1)`; the README's
    Findings): on the 24-layer set it then orthogonalized three stacks of 96, 48 and 24 rows, its step took
    152 ms and its update moved each parameter by about its weight decay alone (measured on an H200). 2-D
    parameters are left as they are."""
    out = []
    for p in params:
        if p.ndim == 2:
            out.append(p)
            continue
        q = torch.nn.Parameter(p.detach().reshape(p.shape[0], -1))
        q.grad = None if p.grad is None else p.grad.reshape(q.shape)
        out.append(q)
    return out


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout


@dataclass
class Result:
    ms: float
    first_s: float
    steps: int
    note: str = ""


def measure(contender: Contender, params: list[torch.nn.Parameter], device: torch.device, args: argparse.Namespace,
            seconds: float) -> Result:
    """Construction + first step (wall), then median of a budgeted number of steps, within `seconds`, after
    any kernel compiling in the background since the first step is done (optimizers/plan.py compile_for); the
    note: what our optimizer's `stats` counted over all its steps."""
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with contender.context():
            t0 = time.perf_counter()
            opt = contender.make(params)
            opt.step()
            _sync(device)
            first = time.perf_counter() - t0
            launches.wait()  # kernels still compiling in the background: the timed steps run the final ones
            t0 = time.perf_counter()
            opt.step()
            _sync(device)
            one = max(time.perf_counter() - t0, 1e-6)
            steps = max(3, min(args.steps, int(args.budget / one)))
            warmup = max(0, min(args.warmup, int(args.budget / 3 / one)))
            times = _times_ms(opt.step, warmup, steps, device)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    stats = opt.stats if isinstance(opt, optimizers.Muon) else None
    note = ""
    if stats is not None and stats.gram:
        note += f" [Gram NS: {stats.gram} matrices, {stats.fallbacks} fallbacks]"
    if stats is not None and stats.products:
        note += f" [triton: {stats.products} products]"
    if stats is not None and stats.capture_failures:
        note += f" [CUDA graph: {stats.capture_failures} failed captures]"
    return Result(statistics.median(times), first, steps, note)


def make_params(shapes: list[tuple[int, ...]], device: torch.device) -> list[torch.nn.Parameter]:
    """fp32 parameters with fp32 gradients, N(0, 1), drawn on the device (seed 0)."""
    gen = torch.Generator(device=device).manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, device=device)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, device=device)
    return params


QUICK = dict(scale=0.005, steps=3, warmup=0, budget=0.1, timeout=30.0, deadline=120.0)
"""--quick: a CPU smoke run of every set and row in seconds (tests/test_gpu_step.py)."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--only", default="", help="regex: keep contenders whose label matches")
    parser.add_argument("--drop", default="", help="regex: leave out contenders whose SET/LABEL matches")
    parser.add_argument("--steps", type=int, default=10, help="most timed steps per contender")
    parser.add_argument("--warmup", type=int, default=3, help="most warm-up steps per contender")
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of timed steps per contender")
    parser.add_argument("--timeout", type=float, default=45.0, help="seconds per contender, all included")
    parser.add_argument("--deadline", type=float, default=215.0, help="seconds for the whole run")
    parser.add_argument("--extra-peers", action="store_true", help="also dion + triton, gram-newton-schulz (torch)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--device", default=None, help="default: cuda when available (cpu with --quick)")
    parser.add_argument("--quick", action="store_true", help=f"CPU smoke run: {QUICK}")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # SET:LABEL, one peer row in this process
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    return args


def run_here(contender: Contender, params: list[torch.nn.Parameter], device: torch.device,
             args: argparse.Namespace, seconds: float) -> Result | str:
    """The contender's Result, or the cell that says why there is none."""
    try:
        return measure(contender, params, device, args, seconds)
    except _Timeout:
        return f"timed out after {seconds:.0f} s (construction, first step or measurement)"
    except Exception as exc:  # a peer that cannot run this set: say why in its cell
        return f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:80]}"
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


CHILD_STARTUP_S = 40.0
"""Seconds a peer's process may take beyond its measurement: interpreter, torch and CUDA start, parameters."""


def run_isolated(set_name: str, label: str, args: argparse.Namespace, seconds: float) -> Result | str:
    """One peer row measured in a fresh process (`--child SET:LABEL`), killed with its process group
    after `seconds` + CHILD_STARTUP_S."""
    command = [sys.executable, os.path.abspath(__file__), "--child", f"{set_name}:{label}", "--timeout", f"{seconds}",
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--budget", str(args.budget),
               "--scale", str(args.scale), "--device", args.device] + (["--extra-peers"] if args.extra_peers else [])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's optimizers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env=env)
    try:
        out, err = child.communicate(timeout=seconds + CHILD_STARTUP_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return f"timed out after {seconds + CHILD_STARTUP_S:.0f} s (its process, startup included)"
    for line in out.splitlines():
        if line.startswith("CHILD "):
            found = json.loads(line[len("CHILD "):])
            return found if isinstance(found, str) else Result(**found)
    tail = (err.strip().splitlines() or [f"exit {child.returncode}"])[-1]
    return f"failed: its process exited {child.returncode}: {tail[:80]}"


def child_main(args: argparse.Namespace) -> None:
    """Measure the one row `--child SET:LABEL` names and print it as `CHILD <json>`."""
    set_name, label = args.child.split(":", 1)
    shapes = SETS[set_name](args.scale)
    (contender,) = [c for c in contenders(any(len(x) > 2 for x in shapes), args.extra_peers) if c.label == label]
    raise_recompile_limit()
    device = torch.device(args.device)
    signal.signal(signal.SIGALRM, _alarm)
    result = run_here(contender, make_params(shapes, device), device, args, args.timeout)
    print("CHILD " + json.dumps(result if isinstance(result, str) else vars(result)), flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child:
        child_main(args)
        return
    start = time.perf_counter()
    device = torch.device(args.device)
    signal.signal(signal.SIGALRM, _alarm)
    peak = matmul_peak(device) if device.type == "cuda" else math.nan
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}; device {name}; measured bf16 matmul peak {peak:.0f} TFLOP/s; "
          f"symmetric products by {symmetric.MAX_BLOCKS} blocks from {2 * symmetric.BLOCK} rows; "
          f"peers each in a process of their own, torch._dynamo recompile limit {RECOMPILE_LIMIT}", flush=True)
    print("| set | matrices | NS TFLOP/step | optimizer | median step ms | steps | first step s | "
          "NS-eq TFLOP/s | % of peak |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|", flush=True)
    sets = args.sets.split(",")
    shapes = {s: SETS[s](args.scale) for s in sets}
    rows = {s: [c for c in contenders(any(len(x) > 2 for x in shapes[s]), args.extra_peers)
                if re.search(args.only, c.label) and not (args.drop and re.search(args.drop, f"{s}/{c.label}"))]
            for s in sets}
    results: dict[str, dict[str, Result]] = {s: {} for s in sets}
    for peers in (False, True):
        for set_name in sets:
            todo = [c for c in rows[set_name] if c.peer == peers]
            if not todo:
                continue
            flops = ns_tflop(shapes[set_name])
            head = f"| {set_name} | {len(shapes[set_name])} | {flops:.3g} |"
            params = make_params(shapes[set_name], device) if not peers and any(c.make for c in todo) else []
            for c in todo:
                left = args.deadline - (time.perf_counter() - start)
                if c.make is None or left < 2:
                    print(f"{head} {c.label} | {c.reason or f'skipped: the {args.deadline:.0f} s run deadline'}"
                          " | | | | |", flush=True)
                    continue
                seconds = min(args.timeout, left)
                r = run_isolated(set_name, c.label, args, seconds) if c.peer else \
                    run_here(c, params, device, args, seconds)
                if isinstance(r, str):
                    print(f"{head} {c.label} | {r} | | | | |", flush=True)
                    continue
                results[set_name][c.label] = r
                rate = flops / (r.ms * 1e-3)
                print(f"{head} {c.label}{r.note} | {r.ms:.2f} | {r.steps} | {r.first_s:.2f} | {rate:.3g} | "
                      f"{100 * rate / peak:.0f} |", flush=True)
            del params
            gc.collect()
    summary(results, rows, args.scale)
    print(f"total {time.perf_counter() - start:.0f} s", flush=True)


def summary(results: dict[str, dict[str, Result]], rows: dict[str, list[Contender]], scale: float) -> None:
    """Per set: the default row and our fastest row, each against the fastest peer (each with its first step) and
    its goal (full-size sets only)."""
    print("\n| set | ours | ms | first step s | fastest peer | ms | first step s | peer / ours | goal ms | "
          "first step <= 3 s |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---|")
    for set_name, measured in results.items():
        peers = {c.label for c in rows[set_name] if c.peer or c.label == "torch.optim.Muon"}
        ours = {k: v for k, v in measured.items() if k not in peers}
        theirs = {k: v for k, v in measured.items() if k in peers}
        if not ours:
            continue
        peer = min(theirs, key=lambda k: theirs[k].ms) if theirs else None
        picks = [(DEFAULT, DEFAULT_GOALS_MS)] if DEFAULT in ours else []
        picks.append((min(ours, key=lambda k: ours[k].ms), FASTEST_GOALS_MS))
        for row, goals in picks:
            goal = f"{goals[set_name]:g} ({'met' if ours[row].ms <= goals[set_name] else 'missed'})" \
                if scale == 1.0 else "(scaled set)"
            first = "yes" if ours[row].first_s <= FIRST_STEP_GOAL_S else f"no ({ours[row].first_s:.1f} s)"
            them = (f"{peer} | {theirs[peer].ms:.2f} | {theirs[peer].first_s:.2f} | "
                    f"{theirs[peer].ms / ours[row].ms:.2f}" if peer else "none measured | | |")
            print(f"| {set_name} | {row} | {ours[row].ms:.2f} | {ours[row].first_s:.2f} | {them} | {goal} | {first} |",
                  flush=True)

if __name__ == "__main__":
    main()

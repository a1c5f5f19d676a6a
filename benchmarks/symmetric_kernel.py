"""Time the Triton symmetric-product kernel's variants (optimizers/symmetric_triton.py, issue 13) against
cuBLAS's full product, on the stacks of the 24-layer step.

    python benchmarks/symmetric_kernel.py [--reps 10] [--variants base,tma,...] [--shapes 0,1,2,3] [--no-sweep]
                                          [--deadline 170]
    TRITON_INTERPRET=1 python benchmarks/symmetric_kernel.py --quick     # CPU smoke run (tiny shapes)
    python benchmarks/symmetric_kernel.py --compile-only                 # no GPU: sm_90 compile of every row

--compile-only compiles each row's kernel for every shape (meta tensors) for sm_90 with triton's own
ptxas, specialised as a launch would be, and prints its shared memory (against the 227 KiB an H100/H200
block may take: past it the launch fails), registers, local (spill) bytes, and whether the k loop is
pipelined (async wgmma) and loads by TMA; exit status 1 when a compile fails or does not fit.

Shapes (bf16): (96, 4096, 4096) X Xᵀ; (72, 4096, 11008) X Xᵀ; (96, 4096, 4096) beta A + alpha A·A
(baddbmm); (72, 4096, 4096) beta R + alpha R·R (baddbmm, as in Gram Newton-Schulz); (36, 4096, 11008)
X Xᵀ with X a transposed view (stored by columns, as the transpose of a tall matrix). All stacks are
made first, with cuBLAS's full product (torch.bmm / torch.baddbmm) timed on each; then
optimizers/symmetric.py's torch row blocks, then each kernel variant at its own launch (ORDER), then
SWEEP (other warps/stages) on every shape. Each row is timed by CUDA events, median of --reps after a
warm-up call, and printed as measured (flushed, so a crash keeps the rows before it): ms, the first call's seconds
(compilation included), "exec" TFLOP/s (the multiply-adds the row runs: the full product for cuBLAS,
the computed tiles for the kernel), "equiv" TFLOP/s (the full product's FLOPs over the time), the
speedup over cuBLAS, max |got - cuBLAS| / max |cuBLAS|, and the mirror: "exact" (the result equals its
transpose bitwise), "tiles" (every tile above the diagonal tiles is the exact transpose of its mirror,
diagonal tiles computed whole: the base kernel), or "NO". "ran" names the variant that ran where it
fell back (optimizers.symmetric_triton.resolve). A failure (compile, launch) is printed in its row and
the run goes on; rows not started by --deadline seconds are printed as skipped. The summary names, per
shape, the fastest kernel row whose difference is within 4 bf16 roundings of cuBLAS's largest entry
and whose mirror holds, and its speedup over cuBLAS and over "base". Exit status 0 when every shape
has one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from optimizers import symmetric  # noqa: E402
from optimizers.kernels import TORCH  # noqa: E402

SHAPES = [  # (label, batch, m, k, kind): "gram" is X Xᵀ, "gram-t" the same with X a transposed view (a tall
    # matrix's transpose, as Gram Newton-Schulz orients it), "poly" is beta C + alpha C·C
    ("X Xᵀ 96x4096x4096", 96, 4096, 4096, "gram"),
    ("X Xᵀ 72x4096x11008", 72, 4096, 11008, "gram"),
    ("A + A·A 96x4096x4096", 96, 4096, 4096, "poly"),
    ("R + R·R 72x4096x4096", 72, 4096, 4096, "poly"),
    ("X Xᵀ 36x4096x11008, X by columns", 36, 4096, 11008, "gram-t"),
]
QUICK_SHAPES = [("X Xᵀ 2x40x72", 2, 40, 72, "gram"), ("A + A·A 2x48x48", 2, 48, 48, "poly"),
                ("X Xᵀ 2x33x47 (masked)", 2, 33, 47, "gram"), ("X Xᵀ 2x40x72, X by columns", 2, 40, 72, "gram-t")]
BETA, ALPHA = -4.775, 2.0315
CARRIED = "SYMMETRIC_KERNEL_ROWS"
"""Environment variable that carries the rows measured before a restart into the new process's summary."""
ORDER = ["persistent", "tma", "base", "even"]
"""Variants at their own launch, in this order (the default first: a --deadline cut drops the last)."""
SWEEP = [("tma", 8, 3), ("tma", 8, 4), ("tma", 4, 3), ("persistent", 4, 5)]
"""(variant, warps, stages) beyond each variant's own launch, run after them (--no-sweep skips them).
On one H200 (torch 2.11, triton 3.6) tma's own 4 warps, 4 stages was the fastest of tma's launches on every
shape, then 8 warps, 4 stages, then 8 warps, 3 stages (1.03-1.08x slower than 4, 4); persistent at 5 stages
ran 0.97-1.00x its own 4 (docs/performance.md §3)."""


def operands(batch, m, k, kind, device, dtype, seed=0):
    """(input or None, a, b) for the product; spectral norms about 1 (no overflow in C·C)."""
    g = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)
    if kind == "gram-t":
        x = torch.randn(batch, k, m, generator=g, device=device, dtype=dtype).mT / (m ** 0.5 + k ** 0.5)
        return None, x, x.mT
    x = torch.randn(batch, m, k, generator=g, device=device, dtype=dtype) / (m ** 0.5 + k ** 0.5)
    if kind == "gram":
        return None, x, x.mT
    c = torch.bmm(x, x.mT)
    c = (c + c.mT) / 2  # bitwise symmetric: the sum commutes
    del x
    return c, c, c


def cublas(input, a, b):
    return torch.bmm(a, b) if input is None else torch.baddbmm(input, a, b, beta=BETA, alpha=ALPHA)


def timed(fn, reps, device, warmup=2):
    """(median ms of `reps` calls after `warmup` calls, last result)."""
    out = None
    for _ in range(warmup):
        out = fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), out
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        del out
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out


def mirror(got, tile):
    if torch.equal(got, got.mT):
        return "exact"
    m = got.size(-1)
    for lo in range(0, m, tile):
        hi = min(lo + tile, m)
        if not torch.equal(got[:, lo:hi, hi:], got[:, hi:, lo:hi].mT):
            return "NO"
    return "tiles"


def tiles_computed(kernel, m, tile):
    """Entries (in tile x tile tiles) the kernel computes, as a fraction of m²."""
    return len(kernel.pair_list(-(-m // tile))) * tile * tile / (m * m)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--variants", default=None, help="comma-separated variant names (default: all, in ORDER)")
    p.add_argument("--shapes", default=None, help="comma-separated indices into the shape list")
    p.add_argument("--no-sweep", action="store_true", help="skip the other warps/stages of the descriptor variants")
    p.add_argument("--deadline", type=float, default=170.0, help="seconds: rows not started by then are skipped")
    p.add_argument("--quick", action="store_true", help="CPU smoke run under TRITON_INTERPRET=1, tiny shapes")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--compile-only", action="store_true",
                   help="no GPU needed: compile every row's kernels for sm_90 with triton's own ptxas and report "
                        "shared memory (against an H200 block's 227 KiB), registers, spills, async wgmma, TMA")
    p.add_argument("--skip", default="", help="';'-separated row tags not to run (a restart passes those done)")
    p.add_argument("--restarts", type=int, default=0, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    skip = {t for t in args.skip.split(";") if t}
    started = time.time()
    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.compile_only:
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        from optimizers import symmetric_triton as kernel  # noqa: PLC0415 - optional: needs triton
    except ImportError as e:
        print(f"no triton: {e}")
        return 1
    import triton  # noqa: PLC0415

    if args.compile_only:
        names = args.variants.split(",") if args.variants else ORDER
        runs = [(n, None, None) for n in names] + ([] if args.no_sweep else [r for r in SWEEP if r[0] in names])
        shapes = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
        return compile_only(kernel, runs, shapes)
    device = torch.device("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not kernel.interpreted():
        print("no GPU: run with --quick (TRITON_INTERPRET=1)")
        return 1
    # the interpreter's bf16 tl.dot is wrong (tests/test_symmetric_triton.py): fp16 on CPU
    dtype = torch.float16 if device.type == "cpu" or args.dtype == "fp16" else torch.bfloat16
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = [shapes[int(i)] for i in args.shapes.split(",")]
    names = args.variants.split(",") if args.variants else None
    runs = [(n, None, None) for n in (ORDER if names is None else names)]
    if not args.no_sweep and not args.quick:
        runs += [r for r in SWEEP if names is None or r[0] in names]
    tile, tile_k = (16, 16) if args.quick else (kernel.TILE, kernel.TILE_K)
    reps, warmup = (1, 1) if args.quick else (args.reps, 2)
    print(f"# symmetric product kernel variants: torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (interpreter)'}, {dtype}, "
          f"tensor descriptors: {kernel.descriptors_available()}, VARIANT = {kernel.VARIANT!r}", flush=True)
    print("| shape | row | ran | ms | first call s | exec TFLOP/s | equiv TFLOP/s | x cuBLAS | max rel diff | mirror |",
          flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)

    carried = json.loads(os.environ.get(CARRIED, "{}"))  # rows measured before a restart
    cases = []  # per shape: label, operands, alpha, full FLOPs, cuBLAS ms and result, error bound, results
    for label, batch, m, k, kind in shapes:
        input, a, b = operands(batch, m, k, kind, device, dtype)
        alpha = 1.0 if input is None else ALPHA  # X Xᵀ: the plain product (bmm)
        full = 2.0 * batch * m * m * k
        ms_ref, ref = timed(lambda: cublas(input, a, b), reps, device, warmup)
        scale = ref.float().abs().max().item()
        print(f"| {label} | cuBLAS | {'bmm' if input is None else 'baddbmm'} | {ms_ref:.2f} | | "
              f"{full / ms_ref / 1e9:.0f} | {full / ms_ref / 1e9:.0f} | 1.00 | 0 | {mirror(ref, tile)} |", flush=True)
        cases.append(dict(label=label, m=m, input=input, a=a, b=b, alpha=alpha, full=full, ms_ref=ms_ref, ref=ref,
                          scale=scale, bound=4 * torch.finfo(dtype).eps,
                          results=[tuple(r) for r in carried.get(label, [])]))

    failures = 0

    def row(case, tag, ran, fn, exec_fraction):
        nonlocal failures
        if tag in skip:
            return
        label, full, ms_ref = case["label"], case["full"], case["ms_ref"]
        t0 = time.time()
        try:
            first = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            first_s = time.time() - t0
            del first
            ms, got = timed(fn, reps, device, max(0, warmup - 1))
        except Exception as e:  # noqa: BLE001 - a variant that cannot compile or launch is a row, not the end
            failures += 1
            text = str(e).strip().splitlines()
            print(f"| {label} | {tag} | {ran} | failed: {type(e).__name__}: {text[0][:160] if text else ''} "
                  f"| | | | | | |", flush=True)
            if device.type == "cuda" and not cuda_alive():
                raise ContextLost(tag) from e
            return
        diff = (got.float() - case["ref"].float()).abs().max().item() / case["scale"]
        mir = mirror(got, tile)
        del got
        print(f"| {label} | {tag} | {ran} | {ms:.2f} | {first_s:.1f} | {exec_fraction * full / ms / 1e9:.0f} | "
              f"{full / ms / 1e9:.0f} | {ms_ref / ms:.2f} | {diff:.2e} | {mir} |", flush=True)
        case["results"].append((ms, tag, ran, diff, mir))

    def summary(title):
        print(f"\n{title}", flush=True)
        ok = True
        for case in cases:
            passing = sorted(r for r in case["results"] if r[1] != "torch row blocks" and r[3] <= case["bound"]
                             and r[4] != "NO")
            base = [r for r in case["results"] if r[1] == "base"]
            if not passing:
                ok = False
                print(f"{case['label']}: no kernel row passed")
                continue
            ms, tag, ran = passing[0][:3]
            vs_base = f", {base[0][0] / ms:.2f}x base" if base else ""
            print(f"{case['label']}: fastest {tag}{'' if ran == tag.split(' ')[0] else f' (ran {ran})'} at "
                  f"{ms:.2f} ms ({case['ms_ref'] / ms:.2f}x cuBLAS{vs_base})", flush=True)
        # one constant (VARIANT) serves every shape: the row tag that passed on all of them in the least
        # total time, with "ran" the tag's own variant on each (no fallback)
        totals: dict[str, float] = {}
        for tag in {r[1] for case in cases for r in case["results"]} - {"torch row blocks"}:
            rows = [[r for r in case["results"] if r[1] == tag and r[3] <= case["bound"] and r[4] != "NO"
                     and r[2] == tag.split(" ")[0]] for case in cases]
            if all(rows):
                totals[tag] = sum(r[0][0] for r in rows)
        if totals:
            best = min(totals, key=totals.get)
            base = (f", base {totals['base']:.1f} ms ({totals['base'] / totals[best]:.2f}x)"
                    if "base" in totals and best != "base" else "")
            print(f"over all shapes: {best} {totals[best]:.1f} ms{base}, cuBLAS "
                  f"{sum(case['ms_ref'] for case in cases):.1f} ms -> VARIANT = {best.split(' ')[0]!r}"
                  f"{' with its warps/stages' if ' ' in best else ''}", flush=True)
        print(f"total {time.time() - started:.0f} s, {failures} failed rows", flush=True)
        return ok

    started_tags = ["torch row blocks"]
    try:
        for case in cases:  # the torch row blocks (optimizers/symmetric.py) once per shape
            m, input, a, b, alpha = case["m"], case["input"], case["a"], case["b"], case["alpha"]
            block = symmetric.BLOCK if m >= 2 * symmetric.BLOCK else max(1, m // 4)
            nb = symmetric.blocks(m, block)
            row(case, "torch row blocks", f"{nb} blocks",
                lambda: symmetric._lower_blocks(input, a, b, BETA, alpha, block, TORCH), (nb + 1) / (2 * nb))
        run_rows(runs, cases, started_tags, row, skip, args, started, kernel, tile, tile_k)
    except ContextLost as lost:  # an illegal address (say) leaves this process's CUDA context unusable
        if args.restarts >= 3:
            print(f"CUDA context lost after {lost.args[0]!r}; no more restarts", flush=True)
            return 1
        left = args.deadline - (time.time() - started)
        print(f"\nCUDA context lost after {lost.args[0]!r}: restarting in a new process without the rows "
              f"run so far ({left:.0f} s of --deadline left; the rows above stay)\n", flush=True)
        os.environ[CARRIED] = json.dumps({case["label"]: case["results"] for case in cases})
        rest = [a for i, a in enumerate(argv) if not (a.startswith(("--skip", "--deadline", "--restarts"))
                                                      or (i and argv[i - 1] in ("--skip", "--deadline", "--restarts")))]
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *rest,
                                  "--skip", ";".join(sorted(skip | set(started_tags))),
                                  "--deadline", f"{max(left, 30):.0f}", "--restarts", str(args.restarts + 1)])
    return 0 if summary("summary:") else 1


SHARED_LIMIT = 227 * 1024
"""Shared memory one block may take on an H100/H200 (sm_90), bytes."""


def compile_only(kernel, runs, shapes, arch=90) -> int:
    """Compile each row's kernel for every shape's operands (meta tensors: no memory, no GPU) for sm_<arch>
    with triton's own ptxas, as a launch would specialise it; print a table. Exit status 1 when a
    compile fails or a kernel's shared memory passes SHARED_LIMIT (it would fail at launch)."""
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    import triton  # noqa: PLC0415
    try:
        from triton._C.libtriton import native_specialize_impl  # noqa: PLC0415 - triton internals (3.4 on)
        from triton.backends.compiler import GPUTarget  # noqa: PLC0415
        from triton.compiler import ASTSource, make_backend  # noqa: PLC0415
    except ImportError as e:
        print(f"--compile-only needs triton's compiler internals of 3.4 or later: {e}")
        return 2
    if not hasattr(kernel._upper_tiles, "arg_names"):
        print("--compile-only compiles, so it runs without TRITON_INTERPRET (set when the kernel module was imported)")
        return 2

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

    def build(fn, args, constexprs, warps, stages):
        signature, values, attrs = {}, {}, {}
        bound = dict(zip(fn.arg_names, args)) | constexprs
        for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
            if name in constexprs or param.is_constexpr:
                signature[name], values[(i,)] = "constexpr", bound.get(name, param.default)
                continue
            kind, key = native_specialize_impl(type(backend), bound[name], False, not param.do_not_specialize, True)
            if kind == "constexpr":
                signature[name], values[(i,)] = "constexpr", key
                continue
            signature[name] = kind
            if isinstance(key, str):
                attrs[(i,)] = backend.parse_attr(key)
        source = ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)
        return triton.compile(source, target=target, options=dict(num_warps=warps, num_stages=stages))

    def usage(compiled):
        if not os.path.exists(cuobjdump):
            return "", ""
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            text = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        fields = dict(part.split(":", 1) for line in text.splitlines() if "REG:" in line for part in line.split()
                      if ":" in part)
        return fields.get("REG", ""), fields.get("LOCAL", "")

    print(f"# compile only: triton {triton.__version__}, sm_{arch}, bf16; shared memory limit {SHARED_LIMIT} B",
          flush=True)
    print("| shape | row | ran | compile s | shared B | fits | registers | local (spill) B | async wgmma | TMA |",
          flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    bad = 0
    for label, batch, m, k, kind in shapes:
        input, a, b = operands(batch, m, k, kind, torch.device("meta"), torch.bfloat16)
        out = torch.empty(batch, m, m, dtype=torch.bfloat16, device="meta")
        for name, warps, stages in runs:
            tag = name if warps is None else f"{name} (warps {warps}, stages {stages})"
            ran = kernel.resolve(name, input, a, b)
            v = kernel.VARIANTS[ran]
            t0 = time.time()
            try:
                fn, _, args, constexprs = kernel.launch_plan(v, input, a, b, out)
                compiled = build(fn, args, constexprs, warps or v.warps or kernel.WARPS,
                                 stages or v.stages or kernel.STAGES)
            except Exception as e:  # noqa: BLE001 - a failed compile is a row
                bad += 1
                text = str(e).strip().splitlines()
                print(f"| {label} | {tag} | {ran} | failed: {type(e).__name__}: {text[0][:200] if text else ''} "
                      f"| | | | | | |", flush=True)
                continue
            shared = compiled.metadata.shared
            regs, local = usage(compiled)
            ptx = compiled.asm.get("ptx", "")
            fits = shared <= SHARED_LIMIT
            bad += not fits
            print(f"| {label} | {tag} | {ran} | {time.time() - t0:.1f} | {shared} | {'yes' if fits else 'NO'} | "
                  f"{regs} | {local} | {'yes' if 'wgmma.wait_group.sync.aligned 1' in ptx else 'no'} | "
                  f"{'yes' if 'cp.async.bulk.tensor' in ptx else 'no'} |", flush=True)
    return 1 if bad else 0


class ContextLost(Exception):
    """A row's failure left the CUDA context unusable (the rows after it need a new process)."""


def cuda_alive() -> bool:
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").item() == 1.0
    except Exception:  # noqa: BLE001 - any CUDA error here means the context is gone
        return False


def run_rows(runs, cases, started_tags, row, skip, args, started, kernel, tile, tile_k) -> None:
    """Every (variant, warps, stages) of `runs` on every case, under --deadline."""
    skipped = 0
    for name, warps, stages in runs:
        tag = name if warps is None else f"{name} (warps {warps}, stages {stages})"
        if tag in skip:
            continue
        started_tags.append(tag)
        for case in cases:
            if time.time() - started > args.deadline:
                skipped += 1
                print(f"| {case['label']} | {tag} | | skipped: past --deadline {args.deadline:.0f} s | | | | | | |",
                      flush=True)
                continue
            input, a, b, alpha = case["input"], case["a"], case["b"], case["alpha"]
            ran = kernel.resolve(name, input, a, b, tile, tile_k)
            fn = (lambda name=name, warps=warps, stages=stages, input=input, a=a, b=b, alpha=alpha:
                  kernel.symmetric_baddbmm(input, a, b, BETA, alpha, tile=tile, tile_k=tile_k, variant=name,
                                           warps=warps, stages=stages))
            row(case, tag, ran, fn, tiles_computed(kernel, case["m"], tile))
    if skipped:
        print(f"{skipped} rows skipped past --deadline", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""A persistent form of the symmetric kernel (one program per SM looping over (matrix, upper tile) work
items), its epilogue branch-free (every tile stores itself and its transpose; a diagonal tile, symmetrised
first, stores the same values twice), against the shipped "tma" variant.

    python persistent_probe.py compile      # no GPU: sm_90 compiles (shared memory, registers), triton 3.6
    python persistent_probe.py time [reps]  # on the GPU: each launch on the 24-layer stacks, bits against tma

Launches tried: flatten / warp_specialize of the work loop, warps, stages. Only a probe: nothing here ships."""
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from optimizers import symmetric_triton as kernel  # noqa: E402

TILE, TILE_K = 128, 64
LAUNCHES = [  # (flatten, warp_specialize, warps, stages)
    (False, False, 4, 4), (True, False, 4, 4), (False, False, 4, 3), (True, False, 4, 3),
    (False, False, 8, 3), (True, False, 8, 3), (False, True, 4, 3), (False, True, 8, 3)]


@triton.jit
def _persistent(a_desc, b_desc, c_desc, out_desc, out_ptr, pairs_ptr, k, n_pairs, total, alpha, beta, identity,
                HAS_C: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr, TILE_M: tl.constexpr,
                TILE_R: tl.constexpr, HAS_IDENTITY: tl.constexpr, NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr,
                WS: tl.constexpr):
    idx = tl.arange(0, TILE_M)
    for work in tl.range(tl.program_id(0), total, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        batch = work // n_pairs
        pair = work - batch * n_pairs
        ti = tl.load(pairs_ptr + 2 * pair)
        tj = tl.load(pairs_ptr + 2 * pair + 1)
        r0 = ti * TILE_M
        c0 = tj * TILE_M
        acc = tl.zeros((TILE_M, TILE_M), dtype=tl.float32)
        for k0 in range(0, k, TILE_R):
            if A_T:
                a = tl.trans(a_desc.load([batch, k0, r0]).reshape(TILE_R, TILE_M))
            else:
                a = a_desc.load([batch, r0, k0]).reshape(TILE_M, TILE_R)
            if B_T:
                b = b_desc.load([batch, c0, k0]).reshape(TILE_M, TILE_R)
                acc = tl.dot(a, tl.trans(b), acc)
            else:
                b = b_desc.load([batch, k0, c0]).reshape(TILE_R, TILE_M)
                acc = tl.dot(a, b, acc)
        acc = acc * alpha
        if HAS_C:
            acc += beta * c_desc.load([batch, r0, c0]).reshape(TILE_M, TILE_M).to(tl.float32)
        diag = ti == tj
        if HAS_IDENTITY:
            acc = tl.where(diag & (idx[:, None] == idx[None, :]), acc + identity, acc)
        result = acc.to(out_ptr.dtype.element_ty)
        result = tl.where(diag & (idx[:, None] > idx[None, :]), tl.trans(result), result)
        out_desc.store([batch, r0, c0], result.reshape(1, TILE_M, TILE_M))
        out_desc.store([batch, c0, r0], tl.trans(result).reshape(1, TILE_M, TILE_M))


SMS = 132


def plan(input, a, b, out, alpha=1.0, beta=1.0, identity=0.0, flatten=False, ws=False):
    """(args, constexprs) of one launch over the upper tiles of a [B, m, k] @ b [B, k, m] (like launch_plan)."""
    batch, m, k = a.shape
    desc = kernel._TensorDescriptor
    a_t, b_t = kernel._by_columns(a), kernel._by_columns(b)
    if a_t:
        at = a.mT
        a_desc = desc(at, list(at.shape), list(at.stride()), [1, TILE_K, TILE])
    else:
        a_desc = desc(a, list(a.shape), list(a.stride()), [1, TILE, TILE_K])
    if b_t:
        bt = b.mT
        b_desc = desc(bt, list(bt.shape), list(bt.stride()), [1, TILE, TILE_K])
    else:
        b_desc = desc(b, list(b.shape), list(b.stride()), [1, TILE_K, TILE])
    out_desc = desc(out, list(out.shape), list(out.stride()), [1, TILE, TILE])
    c_desc = out_desc if input is None else desc(input, list(input.shape), list(input.stride()), [1, TILE, TILE])
    pairs = kernel._pairs(triton.cdiv(m, TILE), a.device, 8)
    n_pairs = pairs.shape[0]
    args = (a_desc, b_desc, c_desc, out_desc, out, pairs, k, n_pairs, n_pairs * batch, float(alpha), float(beta),
            float(identity))
    return args, dict(HAS_C=input is not None, A_T=a_t, B_T=b_t, TILE_M=TILE, TILE_R=TILE_K,
                      HAS_IDENTITY=identity != 0.0, NUM_SMS=SMS, FLATTEN=flatten, WS=ws)


def stacks(device, dtype=torch.bfloat16):
    """The 24-layer step's four kinds of product (benchmarks/symmetric_kernel.py's shapes)."""
    def make(*shape):
        return torch.randn(*shape, device=device, dtype=dtype) if device.type != "meta" else \
            torch.empty(*shape, device=device, dtype=dtype)
    x = make(96, 4096, 4096) / 64
    w = make(72, 4096, 11008) / 105
    t = make(36, 11008, 4096).mT / 105
    a = x @ x.mT if device.type != "meta" else make(96, 4096, 4096)
    return [("X Xt 96x4096x4096", None, x, x.mT, 1.0, 1.0, 0.0),
            ("X Xt 72x4096x11008", None, w, w.mT, 1.0, 1.0, 0.0),
            ("X Xt by columns 36x4096x11008", None, t, t.mT, 1.0, 1.0, 0.0),
            ("aI + bA + cA.A 96x4096x4096", a, a, a, 0.5, -1.2, 2.0)]


def compile_all() -> int:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    fn = _persistent
    bad = 0
    for label, input, a, b, alpha, beta, identity in stacks(torch.device("meta")):
        out = torch.empty(a.shape[0], a.shape[1], a.shape[1], dtype=a.dtype, device="meta")
        for flatten, ws, warps, stages in LAUNCHES:
            args, constexprs = plan(input, a, b, out, alpha, beta, identity, flatten, ws)
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
            t0 = time.time()
            try:
                c = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs),
                                   target=target, options=dict(num_warps=warps, num_stages=stages))
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(f"{label} flatten={flatten} ws={ws} warps={warps} stages={stages}: FAILED "
                      f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}")
                continue
            regs = ""
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(c.asm["cubin"]); f.flush()
                text = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
                regs = " ".join(p for line in text.splitlines() if "REG:" in line for p in line.split()
                                if p.startswith(("REG:", "LOCAL:")))
            ptx = c.asm.get("ptx", "")
            print(f"{label} flatten={flatten} ws={ws} warps={warps} stages={stages}: shared {c.metadata.shared} "
                  f"{regs} async-wgmma {'wgmma.wait_group.sync.aligned 1' in ptx} {time.time() - t0:.1f} s", flush=True)
    return 1 if bad else 0


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def time_all(reps: int) -> None:
    global SMS
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    for label, input, a, b, alpha, beta, identity in stacks(torch.device("cuda")):
        batch, m, k = a.shape
        flops = 2 * batch * k * TILE * TILE * (m // TILE) * (m // TILE + 1) / 2
        ref = kernel.symmetric_baddbmm(input, a, b, beta, alpha, variant="tma", identity=identity)
        rows = []
        for rnd in range(2):
            ms = timed(lambda: kernel.symmetric_baddbmm(input, a, b, beta, alpha, variant="tma", identity=identity), reps)
            rows.append(("tma (4, 4)", ms))
            for flatten, ws, warps, stages in LAUNCHES:
                out = torch.empty_like(ref)
                args, constexprs = plan(input, a, b, out, alpha, beta, identity, flatten, ws)
                tag = f"persistent flatten={flatten} ws={ws} ({warps}, {stages})"
                try:
                    ms = timed(lambda: _persistent[(SMS,)](*args, **constexprs, num_warps=warps, num_stages=stages), reps)
                except Exception as e:  # noqa: BLE001
                    if rnd == 0:
                        print(f"{label} | {tag} | failed {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
                    continue
                same = torch.equal(out, ref)
                rows.append((f"{tag}{'' if same else ' WRONG BITS'}", ms))
        best = {}
        for tag, ms in rows:
            best.setdefault(tag, []).append(ms)
        base = statistics.median(best["tma (4, 4)"])
        for tag, v in best.items():
            print(f"{label} | {tag} | {statistics.median(v):.3f} ms | {flops / statistics.median(v) / 1e9:.0f} TFLOP/s "
                  f"| tma / this {base / statistics.median(v):.3f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        sys.exit(compile_all())
    time_all(int(sys.argv[2]) if len(sys.argv) > 2 else 5)

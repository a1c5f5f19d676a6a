"""Is the Triton mainloop or the tile the limit? On the 24-layer step's stacks: cuBLAS's full product, our
symmetric kernel (upper 128 x 128 tiles), and a plain full Triton GEMM with TMA loads at 128 x 128 and
128 x 256 / 256 x 128 tiles (every tile computed). TFLOP/s on the multiply-adds each runs; median of 7 calls,
rounds interleaved."""
import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, ".")
from optimizers import symmetric_triton as st  # noqa: E402


@triton.jit
def _gemm(a_desc, b_desc, c_desc, M, N, K, B_T: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    tm, tn = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * tn
    g = pid // per_group
    first = g * GROUP
    size = tl.minimum(tm - first, GROUP)
    im = first + (pid % per_group) % size
    jn = (pid % per_group) // size
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = a_desc.load([batch, im * BM, k0]).reshape(BM, BK)
        if B_T:
            b = b_desc.load([batch, jn * BN, k0]).reshape(BN, BK)
            acc = tl.dot(a, tl.trans(b), acc)
        else:
            b = b_desc.load([batch, k0, jn * BN]).reshape(BK, BN)
            acc = tl.dot(a, b, acc)
    c_desc.store([batch, im * BM, jn * BN], acc.to(tl.bfloat16).reshape(1, BM, BN))


def gemm(a, b_rows, out, bm, bn, bk, warps, stages, b_t):
    B, M, K = a.shape
    N = out.shape[-1]
    ad = TensorDescriptor(a, list(a.shape), list(a.stride()), [1, bm, bk])
    bd = (TensorDescriptor(b_rows, list(b_rows.shape), list(b_rows.stride()), [1, bn, bk]) if b_t else
          TensorDescriptor(b_rows, list(b_rows.shape), list(b_rows.stride()), [1, bk, bn]))
    cd = TensorDescriptor(out, list(out.shape), list(out.stride()), [1, bm, bn])
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), B)
    _gemm[grid](ad, bd, cd, M, N, K, B_T=b_t, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)
    return out


def ms(fn, reps=7):
    fn(); torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
    return statistics.median(t)


torch.manual_seed(0)
for label, batch, m, k, kind in [("X Xt 96x4096x4096", 96, 4096, 4096, "gram"), ("R R 72x4096x4096", 72, 4096, 4096, "poly")]:
    x = (torch.randn(batch, m, k, device="cuda") / (m ** 0.5 + k ** 0.5)).to(torch.bfloat16)
    if kind == "poly":
        x = torch.bmm(x, x.mT); x = (x + x.mT) / 2
        a, b, b_rows, b_t = x, x, x, False
    else:
        a, b, b_rows, b_t = x, x.mT, x, True
    out = torch.empty(batch, m, m, device="cuda", dtype=torch.bfloat16)
    full = 2.0 * batch * m * m * k
    sym = full * len(st.pair_list(m // st.TILE)) * st.TILE ** 2 / m ** 2  # the computed tiles
    rows = {
        "cuBLAS full": (lambda: torch.bmm(a, b, out=out), full),
        "ours symmetric tma (4,4)": (lambda: st.symmetric_baddbmm(None, a, b), sym),
        "triton full 128x128x64 w4 s4": (lambda: gemm(a, b_rows, out, 128, 128, 64, 4, 4, b_t), full),
        "triton full 128x256x64 w8 s3": (lambda: gemm(a, b_rows, out, 128, 256, 64, 8, 3, b_t), full),
        "triton full 256x128x64 w8 s3": (lambda: gemm(a, b_rows, out, 256, 128, 64, 8, 3, b_t), full),
        "triton full 128x256x64 w8 s4": (lambda: gemm(a, b_rows, out, 128, 256, 64, 8, 4, b_t), full),
    }
    ref = torch.bmm(a, b)
    times = {n: [] for n in rows}
    for rnd in range(3):
        for name, (fn, fl) in (rows.items() if rnd % 2 == 0 else reversed(list(rows.items()))):
            try:
                times[name].append(ms(fn))
            except Exception as e:  # noqa: BLE001
                times[name].append(float("nan")); print(name, "failed:", str(e).splitlines()[0][:200])
    print(f"== {label}")
    for name, (fn, fl) in rows.items():
        t = statistics.median(times[name])
        got = fn() if "symmetric" in name else (fn(), out)[1]
        err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
        print(f"  {name:32s} {t:8.2f} ms  {fl / t / 1e9:7.1f} TFLOP/s  max rel diff {err:.1e}  rounds {[round(v, 2) for v in times[name]]}")

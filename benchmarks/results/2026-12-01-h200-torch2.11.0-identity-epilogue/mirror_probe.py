"""What the mirror store costs: 9fb9f72's kernel (MIRROR 0: the transposed tile stored by TMA) against the same
kernel storing no mirror (MIRROR 1: a wrong result, timed only) and storing it by pointers (MIRROR 2), on the
24-layer step's stacks; medians of 5 calls, 4 rounds in rotating order."""
import statistics
import sys
from collections import defaultdict

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
from optimizers import symmetric_triton as st  # noqa: E402


@triton.jit
def _probe(a_desc, b_desc, out_desc, out_ptr, pairs_ptr, m, k, B_T: tl.constexpr, TILE_M: tl.constexpr,
           TILE_R: tl.constexpr, MIRROR: tl.constexpr):
    pair = tl.program_id(0)
    batch = tl.program_id(1)
    ti, tj = tl.load(pairs_ptr + 2 * pair), tl.load(pairs_ptr + 2 * pair + 1)
    r0 = ti * TILE_M
    c0 = tj * TILE_M
    acc = tl.zeros((TILE_M, TILE_M), dtype=tl.float32)
    for k0 in range(0, k, TILE_R):
        a = a_desc.load([batch, r0, k0]).reshape(TILE_M, TILE_R)
        if B_T:
            b = b_desc.load([batch, c0, k0]).reshape(TILE_M, TILE_R)
            acc = tl.dot(a, tl.trans(b), acc)
        else:
            b = b_desc.load([batch, k0, c0]).reshape(TILE_R, TILE_M)
            acc = tl.dot(a, b, acc)
    result = acc.to(out_ptr.dtype.element_ty)
    if ti == tj:
        idx = tl.arange(0, TILE_M)
        result = tl.where(idx[:, None] > idx[None, :], tl.trans(result), result)
        out_desc.store([batch, r0, c0], result.reshape(1, TILE_M, TILE_M))
    else:
        out_desc.store([batch, r0, c0], result.reshape(1, TILE_M, TILE_M))
        if MIRROR == 0:
            out_desc.store([batch, c0, r0], tl.trans(result).reshape(1, TILE_M, TILE_M))
        elif MIRROR == 2:
            i = tl.arange(0, TILE_M)
            base = out_ptr + batch.to(tl.int64) * m * m
            tl.store(base + (c0 + i[None, :]) * m + (r0 + i[:, None]), result)


def run(a, b, mirror, b_t):
    batch, m, k = a.shape
    out = torch.empty(batch, m, m, dtype=a.dtype, device=a.device)
    D = st._TensorDescriptor
    ad = D(a, list(a.shape), list(a.stride()), [1, 128, 64])
    bd = D(b, list(b.shape), list(b.stride()), [1, 128, 64] if b_t else [1, 64, 128])
    od = D(out, list(out.shape), list(out.stride()), [1, 128, 128])
    pairs = st._pairs(m // 128, a.device, 8)
    _probe[(pairs.shape[0], batch)](ad, bd, od, out, pairs, m, k, B_T=b_t, TILE_M=128, TILE_R=64, MIRROR=mirror,
                                    num_warps=4, num_stages=4)
    return out


def ms(fn, reps=5):
    fn(); torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
    return statistics.median(t)


torch.manual_seed(0)
for label, batch, m, k, kind in [("X Xt 96x4096x4096", 96, 4096, 4096, "gram"),
                                  ("X Xt 48x4096x11008", 48, 4096, 11008, "gram"),
                                  ("R W 72x4096x4096", 72, 4096, 4096, "product")]:
    x = (torch.randn(batch, m, k, device="cuda") / (m ** 0.5 + k ** 0.5)).to(torch.float16)
    if kind == "product":
        x = torch.bmm(x, x.mT); x = (x + x.mT) / 2
        a, b, b_t = x, x, False
    else:
        a, b, b_t = x, x, True
    rows = {"kernel (9fb9f72)": lambda: st.symmetric_baddbmm(None, a, b if not b_t else b.mT),
            "MIRROR 0 (TMA, transposed)": lambda: run(a, b, 0, b_t),
            "MIRROR 1 (none: timing only)": lambda: run(a, b, 1, b_t),
            "MIRROR 2 (pointers)": lambda: run(a, b, 2, b_t)}
    ref = rows["kernel (9fb9f72)"]()
    times = defaultdict(list)
    names = list(rows)
    for rnd in range(4):
        for name in names[rnd % 4:] + names[:rnd % 4]:
            times[name].append(ms(rows[name]))
    print(f"== {label} (fp16)")
    base = statistics.median(times[names[0]])
    for name in names:
        t = statistics.median(times[name])
        same = torch.equal(rows[name](), ref)
        print(f"  {name:30s} {t:7.2f} ms  x{base / t:.3f}  same bits as the kernel: {same}  rounds {[round(v, 2) for v in times[name]]}")
    del x, a, b, ref

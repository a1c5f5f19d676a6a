"""The 24-layer step's memory-bound passes on their own, at the step's sizes (fp32 parameters, momentum blocks
[96, 4096, 4096], [48, 11008, 4096], [24, 4096, 11008]): the fused momentum kernel, torch's norm of each block,
the divide kernel and the apply kernel, each at its shipped launch and at other launches (block, warps,
programs), in GB/s; and a probe kernel that forms the sum of squares (fp64 lanes) inside the momentum pass,
against the momentum pass plus torch's norms."""
import statistics

import torch
import triton
import triton.language as tl

from optimizers import elementwise_triton as ek

dev = torch.device("cuda")
SHAPES = [(96, 4096, 4096), (48, 11008, 4096), (24, 4096, 11008)]
gen = torch.Generator(device=dev).manual_seed(0)
blocks = [torch.randn(s, generator=gen, device=dev) for s in SHAPES]
bufs = [row for b in blocks for row in b.unbind(0)]
grads = [torch.randn(b.shape, generator=gen, device=dev) for b in bufs]
params = [torch.randn(b.shape, generator=gen, device=dev) for b in bufs]
n_elems = sum(b.numel() for b in bufs)
GB = n_elems * 4 / 1e9


def timed(fn, reps=7):
    for _ in range(2):
        fn()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def report(label, ms, gbytes):
    print(f"{label:58s} {ms:8.3f} ms  {gbytes / ms:7.1f} GB/s")


buf_t, grad_t = ek._addresses(bufs, dev), ek._addresses(grads, dev)
numels = ek._table([b.numel() for b in bufs], dev)
maxn = max(b.numel() for b in bufs)
print(f"{len(bufs)} tensors, {n_elems / 1e9:.2f} G elements; fp32 tensor set {GB:.1f} GB")
print("-- momentum M <- mu M + G (read M, G; write M)")
report("shipped momentum_", timed(lambda: ek.momentum_(bufs, grads, 0.95)), 3 * GB)
for block in (1024, 2048, 4096, 8192):
    for warps in (4, 8, 16):
        for programs in (264, 528, 1024, 2048):
            grid = (min(programs, triton.cdiv(maxn, block)), len(bufs))
            ms = timed(lambda: ek._momentum[grid](buf_t, grad_t, numels, 0.95, BLOCK=block, num_warps=warps,
                                                   enable_fp_fusion=False), reps=5)
            report(f"  block {block} warps {warps} programs {programs}", ms, 3 * GB)

print("-- torch.linalg.vector_norm of each block (read M)")
report("three vector_norm calls", timed(lambda: [torch.linalg.vector_norm(b, dim=(-2, -1)) for b in blocks]), GB)


@triton.jit
def _momentum_sumsq(buf_table, grad_table, numel_table, partial_ptr, mu, BLOCK: tl.constexpr):
    t = tl.program_id(1)
    buf = tl.load(buf_table + t).to(tl.pointer_type(tl.float32))
    grad = tl.load(grad_table + t).to(tl.pointer_type(tl.float32))
    n = tl.load(numel_table + t)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < n
        m = tl.load(buf + offs, mask=inside, other=0.0)
        g = tl.load(grad + offs, mask=inside, other=0.0)
        new = m * mu + g
        tl.store(buf + offs, new, mask=inside)
        wide = new.to(tl.float64)
        acc += wide * wide
    tl.store(partial_ptr + t * tl.num_programs(0) + tl.program_id(0), tl.sum(acc))


print("-- probe: momentum with the sum of squares in fp64 lanes (per-program partials), then the norms")
for block in (2048, 4096):
    for warps in (4, 8):
        programs = min(1024, triton.cdiv(maxn, block))
        partials = torch.empty(len(bufs), programs, dtype=torch.float64, device=dev)

        def fused():
            _momentum_sumsq[(programs, len(bufs))](buf_t, grad_t, numels, partials, 0.95, BLOCK=block,
                                                   num_warps=warps, enable_fp_fusion=False)
            return partials.sum(1).sqrt().float()
        report(f"  fused, block {block} warps {warps}", timed(fused), 3 * GB)
ms_sep = timed(lambda: (ek.momentum_(bufs, grads, 0.95), [torch.linalg.vector_norm(b, dim=(-2, -1)) for b in blocks]))
report("shipped momentum_ + three vector_norm calls", ms_sep, 4 * GB)
a = torch.linalg.vector_norm(blocks[0], dim=(-2, -1))
partials = torch.empty(len(bufs), 1024, dtype=torch.float64, device=dev)
bt0 = ek._addresses(bufs[:96], dev)
zeros = [torch.zeros_like(b) for b in bufs[:96]]
_momentum_sumsq[(1024, 96)](bt0, ek._addresses(zeros, dev), ek._table([b.numel() for b in bufs[:96]], dev), partials,
                            1.0, BLOCK=4096, enable_fp_fusion=False)
f = partials[:96].sum(1).sqrt().float()
print(f"  norms: fp64 lanes vs torch fp32, max relative difference {((f - a).abs() / a).max().item():.3e}")

print("-- divide X / d to fp16 (read fp32, write fp16)")
d = torch.full((1,), 3.0, device=dev)
for b in blocks:
    dd = d.expand(b.size(0)).reshape(-1, 1, 1).contiguous()
    report(f"shipped divide {tuple(b.shape)}", timed(lambda: ek.divide(b, dd, torch.float16)), b.numel() * 6 / 1e9)
b = blocks[0]
dd = d.expand(b.size(0)).reshape(-1, 1, 1).contiguous()
out = torch.empty_like(b, dtype=torch.float16)
per = b[0].numel()
for block in (2048, 4096, 8192):
    for warps in (4, 8):
        for programs in (264, 1024):
            grid = (min(programs, triton.cdiv(per, block)), b.size(0))
            ms = timed(lambda: ek._divide[grid](b, dd, out, per, BLOCK=block, num_warps=warps, enable_fp_fusion=False), reps=5)
            report(f"  {tuple(b.shape)} block {block} warps {warps} programs {programs}", ms, b.numel() * 6 / 1e9)

print("-- apply X <- X decay + alpha O (read X fp32, O fp16; write X)")
starts = [0, 96, 144, 168]
outs = [torch.randn(s, generator=gen, device=dev).half() for s in ((96, 4096, 4096), (48, 4096, 11008), (24, 4096, 11008))]
mats = [outs[0], outs[1].mT, outs[2]]
total = 0.0
for i, m in enumerate(mats):
    ps = params[starts[i]:starts[i + 1]]
    ms = timed(lambda: ek.apply_(ps, m, 0.999, -0.01))
    total += ms
    report(f"shipped apply_ {tuple(m.shape)} strides {m.stride()}", ms, m.numel() * 10 / 1e9)
print(f"shipped apply_ total {total:.3f} ms")
for i, m in enumerate(mats):
    ps = params[starts[i]:starts[i + 1]]
    table = ek._addresses(ps, dev)
    batch, rows, cols = m.shape
    for tr, tc in ((64, 64), (32, 128), (64, 128), (128, 64)):
        for warps in (4, 8):
            grid = (triton.cdiv(rows, tr) * triton.cdiv(cols, tc), batch)
            ms = timed(lambda: ek._apply[grid](table, m, 1, rows, cols, *m.stride(), 0.999, -0.01, HAS_DECAY=True,
                                               TILE_R=tr, TILE_C=tc, num_warps=warps, enable_fp_fusion=False), reps=5)
            report(f"  {tuple(m.shape)} tile {tr}x{tc} warps {warps}", ms, m.numel() * 10 / 1e9)

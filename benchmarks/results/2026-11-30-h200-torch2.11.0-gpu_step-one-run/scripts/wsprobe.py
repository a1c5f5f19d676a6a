"""Does an inner-loop warp-specialized TMA upper-tile kernel compile and run faster on this triton?"""
import statistics, torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor as D
from optimizers import symmetric_triton as st
print("triton", triton.__version__, flush=True)
@triton.jit
def k_ws(a_desc, b_desc, c_desc, out_desc, pairs_ptr, k, alpha, beta, HAS_C: tl.constexpr,
         TILE_M: tl.constexpr, TILE_R: tl.constexpr, WS: tl.constexpr):
    pair = tl.program_id(0); batch = tl.program_id(1)
    ti, tj = tl.load(pairs_ptr + 2 * pair), tl.load(pairs_ptr + 2 * pair + 1)
    r0 = ti * TILE_M; c0 = tj * TILE_M
    acc = tl.zeros((TILE_M, TILE_M), dtype=tl.float32)
    for k0 in tl.range(0, k, TILE_R, warp_specialize=WS):
        a = a_desc.load([batch, r0, k0]).reshape(TILE_M, TILE_R)
        b = b_desc.load([batch, c0, k0]).reshape(TILE_M, TILE_R)
        acc = tl.dot(a, tl.trans(b), acc)
    acc = acc * alpha
    if HAS_C:
        acc += beta * c_desc.load([batch, r0, c0]).reshape(TILE_M, TILE_M).to(tl.float32)
    result = acc.to(tl.float16)
    idx = tl.arange(0, TILE_M)
    lower = (idx[:, None] > idx[None, :]) & (tj == ti)
    result = tl.where(lower, tl.trans(result), result)
    out_desc.store([batch, r0, c0], result.reshape(1, TILE_M, TILE_M))
    out_desc.store([batch, c0, r0], tl.trans(result).reshape(1, TILE_M, TILE_M))
def t_ms(fn, reps=5):
    fn(); torch.cuda.synchronize(); out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out)
g = torch.Generator(device="cuda").manual_seed(0)
for bt, m, kk in ((96, 4096, 4096), (24, 4096, 11008)):
    x = torch.randn(bt, m, kk, device="cuda", dtype=torch.float16, generator=g) / 100
    out = torch.empty(bt, m, m, device="cuda", dtype=torch.float16)
    T, TK = 128, 64
    ad = D(x, list(x.shape), list(x.stride()), [1, T, TK]); od = D(out, list(out.shape), list(out.stride()), [1, T, T])
    pairs = st._pairs(m // T, x.device, 8)
    ref = st.symmetric_baddbmm(None, x, x.mT)
    base = t_ms(lambda: st.symmetric_baddbmm(None, x, x.mT))
    print(f"== {bt}x{m}x{kk}: tma(4,4) {base:.2f} ms", flush=True)
    for ws in (False, True):
        for w, s in ((4, 4), (4, 3), (8, 3), (8, 4), (4, 2), (8, 2)):
            try:
                fn = lambda: k_ws[(pairs.shape[0], bt)](ad, ad, od, od, pairs, kk, 1.0, 1.0, HAS_C=False, TILE_M=T, TILE_R=TK, WS=ws,
                                                        num_warps=w, num_stages=s)
                ms = t_ms(fn)
                same = torch.equal(out, ref)
                print(f"  ws={ws} w={w} s={s}: {ms:.2f} ms x{base/ms:.3f} same-bits={same}", flush=True)
            except Exception as e:
                print(f"  ws={ws} w={w} s={s}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}", flush=True)
    del x, out, ref; torch.cuda.empty_cache()

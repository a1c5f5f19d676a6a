"""Do triton compiles overlap in threads? python compile_threads.py serial|threads|procs N"""
import sys, time, os
import torch, triton
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, ".")
from optimizers import symmetric_triton as st
mode, n = sys.argv[1], int(sys.argv[2])
dev = torch.device("cuda")
def spec(i):
    dtype = (torch.bfloat16, torch.float16)[i % 2]
    has_c, bt = bool(i // 2 % 2), bool(i // 4 % 2)
    k = 4096 + 16 * (i // 8)   # distinct k: same divisibility, so identical specializations past 8 -> use tile_k
    return dtype, has_c, bt
def one(i):
    dtype, has_c, bt = spec(i)
    a = torch.empty(1, 256, 512, dtype=dtype, device=dev)
    b = a.mT if bt else torch.empty(1, 512, 256, dtype=dtype, device=dev)
    c = torch.empty(1, 256, 256, dtype=dtype, device=dev) if has_c else None
    out = torch.empty(1, 256, 256, dtype=dtype, device=dev)
    v = st.VARIANTS["tma"] if i < 8 else st.VARIANTS["base"]
    fn, grid, args, cx = st.launch_plan(v, c, a, b, out)
    s = time.perf_counter()
    fn.warmup(*args, grid=grid, num_warps=4, num_stages=4, **cx)
    return time.perf_counter() - s
t = time.perf_counter()
if mode == "serial":
    each = [one(i) for i in range(n)]
else:
    with ThreadPoolExecutor(n) as ex:
        each = list(ex.map(one, range(n)))
print(f"{mode} {n}: wall {time.perf_counter() - t:.2f} s, each {[round(e, 2) for e in each]}")

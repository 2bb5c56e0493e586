"""wgmma_variants: tiles of the warp-group matmul (``matmul_wgmma``) at N^3 bf16, and diagnostic
variants made by text patches of a tile's source, to see which part of its K loop costs.

GPU only (an sm_90 NVIDIA device; torch with CUDA for the inputs and the f32 reference). Each
argument is a tile name with optional ``+patch`` suffixes: ``nofence`` drops the proxy fence,
``nocopy`` the K loop's copies (results wrong: local memory keeps the prologue's slabs), ``nobar``
the K loop's barrier (results may be wrong). Timing: wall time over 20 queued launches, median of
5 samples; the error printed is relative to the largest reference magnitude. One process per tile
keeps a slow ptxas build (or a fault) from taking the others with it:

    for v in 128x256x16:p3:i1:r4 128x256x16:p3:i0 128x128x32:p2:i0+nocopy+nobar; do
      timeout 40 python benchmarks/wgmma_variants.py 4096 $v; done
"""
import statistics
import sys
import time

import numpy as np
import pyopencl as cl
import torch

from triodnn import MatmulDesc, MemoryDesc
from triodnn.actors import build_program
from triodnn.kernels import matmul_wgmma, select_config

plat = [p for p in cl.get_platforms() if "NVIDIA" in p.name][0]
dev = plat.get_devices()[0]
ctx = cl.Context([dev])
q = cl.CommandQueue(ctx)
cfg = select_config("gpu", dev.max_work_group_size, dev.local_mem_size, nvidia_sm=90)
mf = cl.mem_flags
M = N = K = int(sys.argv[1])
md = lambda *d: MemoryDesc(tuple(d), "bf16")  # noqa: E731
g = torch.Generator(device="cuda").manual_seed(0)
a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
b = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
bits = lambda t: t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)  # noqa: E731
abuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bits(a))
bbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bits(b))
dbuf = cl.Buffer(ctx, mf.READ_WRITE, M * N * 2)
want = torch.matmul(a.float(), b.float()).cpu().numpy()

PATCHES = {
    "nofence": [('asm volatile("fence.proxy.async.shared::cta;" ::: "memory");', "")],
    "nocopy": [("if (nt < ", "if (0 && nt < ")],
    "nobar": [("        barrier(CLK_LOCAL_MEM_FENCE);\n        { const uint nt", "        { const uint nt")],
}
for arg in sys.argv[2:]:
    tile, *flags = arg.split("+")
    spec = matmul_wgmma.generate(MatmulDesc(md(M, K), md(K, N)), cfg, tile=tile)
    src = spec.source
    for f in flags:
        for old, new in PATCHES[f]:
            assert old in src, (f, old)
            src = src.replace(old, new)
    try:
        kern = getattr(build_program(ctx, dev, src, ptx_target=spec.ptx_target), spec.name)
    except Exception as e:
        print(arg, "BUILD FAILED", str(e)[:1500], flush=True)
        continue
    launch = lambda: kern(q, spec.global_size, spec.local_size, abuf, bbuf, dbuf)  # noqa: E731
    launch()
    q.finish()
    out = np.empty(M * N, np.uint16)
    cl.enqueue_copy(q, out, dbuf)
    got = (out.astype(np.uint32) << 16).view(np.float32).reshape(M, N)
    err = np.abs(got - want).max() / np.abs(want).max()
    times = []
    for _ in range(5):
        q.finish()
        t0 = time.perf_counter()
        for _ in range(20):
            launch()
        q.finish()
        times.append((time.perf_counter() - t0) / 20)
    t = statistics.median(times)
    print(f"{arg}: {2 * M * N * K / t / 1e12:.0f} TFLOP/s ({t * 1e6:.0f} us), rel err {err:.1e}", flush=True)

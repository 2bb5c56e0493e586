"""tune_int8_mma_tiles: the int8 tensor-core matmul (``quantized_matmul_mma``) tile by tile,
beside triodnn's bf16 tensor-core matmul and torch's int8 (``torch._int_mm``) and bf16 products
of the same shape, to pick its ``PREFERENCE`` and to say where int8 stands.

Each case: u8 src x s8 weights -> f32 dst (scales 1, so dst is the exact int32 sum rounded to
f32 once), weights N-contiguous or K-contiguous, zero points optional. The kernel is generated
by ``quantized_matmul.generate(desc, config, mma_tile=...)`` (None: what it picks), built on the
first NVIDIA device as the engine builds it, and checked against torch's int64 sums of the same
inputs (with the zero points subtracted) before timing: equal, element for element.
Timing, the same for every variant: wall time over N queued runs (N launches then
``clFinish``; torch: N calls then ``cuda.synchronize``), median of 5 samples, the variants
(triodnn int8, triodnn bf16, torch int8, torch bf16) taken in turns. Each case runs in its own
process (``python tune_int8_mma_tiles.py I``). GPU only: torch with CUDA and NVIDIA's OpenCL on
an sm_80+ device.

    n=$(python benchmarks/tune_int8_mma_tiles.py count)
    for i in $(seq 0 $((n - 1))); do python benchmarks/tune_int8_mma_tiles.py $i; done
"""
import statistics
import sys
import time
import traceback

import _common as common
import numpy as np
import pyopencl as cl
import torch

from triodnn import MatmulDesc, MemoryDesc, QuantizedMatmulDesc
from triodnn.kernels import matmul, quantized_matmul, quantized_matmul_mma

nv = common.NvidiaDevice()
dev, ctx, q, sm, cfg = nv.device, nv.context, nv.queue, nv.sm, nv.config
if sys.argv[1] == "0":
    print("device", dev.name, "sm", sm, cfg, flush=True)
mf = cl.mem_flags


def timed(launch, finish, reps):
    finish()
    t0 = time.perf_counter()
    for _ in range(reps):
        launch()
    finish()
    return (time.perf_counter() - t0) / reps


def run_case(tag, m, n, k, tile, k_major=True, src_zp=0, wei_zp=0, reps=20, time_it=True):
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randint(0, 256, (m, k), device="cuda", generator=g, dtype=torch.int32).to(torch.uint8)
    b = torch.randint(-128, 128, (k, n), device="cuda", generator=g, dtype=torch.int32).to(torch.int8)
    wdesc = MemoryDesc((k, n), "s8") if k_major else MemoryDesc((k, n), "s8", "ba")
    desc = QuantizedMatmulDesc(MemoryDesc((m, k), "u8"), wdesc, MemoryDesc((m, n), "f32"),
                               src_zp=src_zp, wei_zps=[wei_zp] if wei_zp else [])
    assert quantized_matmul_mma.applies(desc, cfg), tag
    spec = quantized_matmul.generate(desc, cfg, mma_tile=tile)
    built = nv.build_timed(spec, f"{tag} {tile}")
    if built is None:
        return None
    kern, build_s = built
    bhost = b.cpu().numpy() if k_major else np.ascontiguousarray(b.cpu().numpy().T)
    abuf = nv.upload(a.cpu().numpy())
    bbuf = nv.upload(bhost)
    dbuf = cl.Buffer(ctx, mf.READ_WRITE, m * n * 4)
    launch = lambda: kern(q, spec.global_size, spec.local_size, abuf, bbuf, dbuf)  # noqa: E731
    launch()
    q.finish()
    got = np.empty(m * n, np.float32)
    cl.enqueue_copy(q, got, dbuf)
    # Exact sums on the GPU in f64 (every partial sum an integer below 2^53), rounded once to f32.
    want = torch.matmul(a.double() - src_zp, b.double() - wei_zp).float().cpu().numpy().reshape(-1)
    bad = int(np.count_nonzero(got != want))
    line = f"{tag} {spec.impl}: build {build_s * 1e3:.0f} ms, {'EQUAL' if bad == 0 else f'{bad} WRONG of {got.size}'}"
    if bad:
        first = np.flatnonzero(got != want)[:4]
        line += f" (first {first.tolist()} got {got[first].tolist()} want {want[first].tolist()})"
    if bad == 0 and time_it:
        ops = 2.0 * m * n * k
        a16 = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        b16 = torch.randn(k, n, device="cuda", generator=g).to(torch.bfloat16)
        bf = MatmulDesc(MemoryDesc((m, k), "bf16"), MemoryDesc((k, n), "bf16"), MemoryDesc((m, n), "bf16"))
        bspec = matmul.generate(bf, cfg)
        bkern = nv.build(bspec)
        a16buf = nv.upload(a16.view(torch.int16).cpu().numpy())
        b16buf = nv.upload(b16.view(torch.int16).cpu().numpy())
        d16buf = cl.Buffer(ctx, mf.READ_WRITE, m * n * 2)
        blaunch = lambda: bkern(q, bspec.global_size, bspec.local_size, a16buf, b16buf, d16buf)  # noqa: E731
        a8 = a.to(torch.int8)  # torch._int_mm takes s8 x s8; the rate is what matters here
        b_cols = b.t().contiguous().t()  # cuBLASLt's int8 GEMM wants column-major weights
        variants = {
            "triodnn int8": (launch, q.finish),
            f"triodnn bf16 ({bspec.impl})": (blaunch, q.finish),
            "torch int8": (lambda: torch._int_mm(a8, b_cols), torch.cuda.synchronize),
            "torch bf16": (lambda: torch.matmul(a16, b16), torch.cuda.synchronize),
        }
        samples = {name: [] for name in variants}
        for go, finish in variants.values():  # warm each once
            go()
            finish()
        for _ in range(5):
            for name, (go, finish) in variants.items():
                samples[name].append(timed(go, finish, reps))
        line += ";" + ",".join(f" {name} {statistics.median(s) * 1e6:.1f} us {ops / statistics.median(s) / 1e12:.0f} TOP/s"
                               for name, s in samples.items())
        mine = statistics.median(samples["triodnn int8"])
        line += (f"; int8 / our bf16 {statistics.median(samples[f'triodnn bf16 ({bspec.impl})']) / mine:.2f}x,"
                 f" / torch int8 {statistics.median(samples['torch int8']) / mine:.2f}x")
    print(line, flush=True)
    return bad == 0


cases = []
for tile in quantized_matmul_mma.TILES:
    for k_major in (True, False):
        cases.append((f"int8 4096^3 {'N' if k_major else 'K'}-contiguous weights", 4096, 4096, 4096, tile, k_major,
                      0, 0, 20, True))
cases += [
    ("int8 4096^3 zero points 128 / -3", 4096, 4096, 4096, None, True, 128, -3, 20, True),
    ("int8 8192^3", 8192, 8192, 8192, None, True, 0, 0, 5, True),
    ("int8 2048^3", 2048, 2048, 2048, None, True, 0, 0, 50, True),
    ("int8 64x1024x1024", 64, 1024, 1024, None, True, 0, 0, 100, True),
    ("int8 edges 1000x1008x1040 zero points", 1000, 1008, 1040, None, True, 7, 2, 5, False),
]
if sys.argv[1] == "count":
    print(len(cases))
    sys.exit()
c = cases[int(sys.argv[1])]
try:
    run_case(*c)
except Exception:
    print(c[0], c[4], "ERROR", traceback.format_exc()[-1500:], flush=True)

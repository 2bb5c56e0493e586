"""probe_wgmma: what Hopper's warp-group MMA gives from NVIDIA's OpenCL, before any GEMM around it.

GPU only (an sm_90 NVIDIA device, NVIDIA's OpenCL; numpy and pyopencl). Kernels are built as the
engine builds them (``actors.build_program`` with ``ptx_target="sm_90a"``, instructions behind
``kernels._ptx.MARK``). Stages, each printing its lines:

  layout   : one m64nNk16 bf16 product per warp group, operands packed on the host as the tensor
             cores' core matrices (K-major A; B K-major, trans-b 0, or N-major, trans-b 1), copied
             to local memory as is; the f32 results compared with numpy's exactly
  peak     : a loop of wgmma m64nNk16 on fixed local memory, and one of mma.sync m16n8k16 on
             registers: the tensor cores' rate with nothing else in the kernel (best of 5 launches,
             wall time of one launch of 528 work-groups)
  localmem : the largest ``__local`` kernel argument an enqueue accepts

    python benchmarks/probe_wgmma.py layout peak localmem
"""
import sys
import time

import numpy as np
import pyopencl as cl

from triodnn.actors import build_program
from triodnn.kernels._ptx import MARK, marked

plat = [p for p in cl.get_platforms() if "NVIDIA" in p.name][0]
dev = plat.get_devices()[0]
ctx = cl.Context([dev])
q = cl.CommandQueue(ctx)
mf = cl.mem_flags
print("device", dev.name, "local", dev.local_mem_size, "multiprocessors", dev.max_compute_units, flush=True)

HELPERS = f"""
static inline ulong gdesc(uint addr, uint lbo, uint sbo) {{
    return (ulong)((addr & 0x3FFFFu) >> 4) | ((ulong)(lbo >> 4) << 16) | ((ulong)(sbo >> 4) << 32);
}}
static inline void wg_fence(void) {{ asm volatile("{MARK}wgmma.fence.sync.aligned;" ::: "memory"); }}
static inline void wg_commit(void) {{ asm volatile("{MARK}wgmma.commit_group.sync.aligned;" ::: "memory"); }}
static inline void wg_wait0(void) {{ asm volatile("{MARK}wgmma.wait_group.sync.aligned 0;" ::: "memory"); }}
"""


def build(src):
    return build_program(ctx, dev, src, ptx_target="sm_90a")


def wgmma_asm(n, trans_b):
    """One m64n{n}k16 into d0..d{n/2-1} (tied), descriptors da and db."""
    nacc = n // 2
    regs = ",".join(f"%{i}" for i in range(nacc))
    body = marked("{", ".reg .pred p;", f"setp.ne.b32 p, %{nacc + 2}, 0;",
                  f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{regs}}}, %{nacc}, %{nacc + 1}, "
                  f"p, 1, 1, 0, {trans_b};", "}")
    outs = ", ".join(f'"+f"(d{i})' for i in range(nacc))
    return f'asm volatile("{body}" : {outs} : "l"(da), "l"(db), "r"(1u) : "memory");'


def to_bf16_bits(x):
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def pack_k_major(mat):
    """rows x k (k contiguous) -> core matrices of 8 rows x 8 k, ordered along rows first."""
    rows, k = mat.shape
    return np.ascontiguousarray(mat.reshape(rows // 8, 8, k // 8, 8).transpose(2, 0, 1, 3)).reshape(-1)


def pack_n_major(mat):
    """k x n (n contiguous) -> core matrices of 8 k x 8 n, ordered along n first."""
    k, n = mat.shape
    return np.ascontiguousarray(mat.reshape(k // 8, 8, n // 8, 8).transpose(0, 2, 1, 3)).reshape(-1)


def layout_kernel(n, k, trans_b):
    """A 64 x k, B n x k (or k x n): leading offset (between K groups) rows x 16 bytes, stride
    offset (between 8-row groups) 128 bytes; D stored row-major."""
    nacc = n // 2
    stores = [f"out[(w * 16u + lane / 4u + {8 * (r // 2)}u) * {n}u + {8 * j}u + (lane % 4u) * 2u + {r % 2}u] = d{4 * j + r};"
              for j in range(n // 8) for r in range(4)]
    steps = "\n".join(f"    {{ const ulong da = gdesc(abase + {s * 2048}u, 1024u, 128u), "
                      f"db = gdesc(bbase + {s * 2 * n * 16}u, {n * 16}u, 128u); {wgmma_asm(n, trans_b)} }}"
                      for s in range(k // 16))
    return HELPERS + f"""
__kernel __attribute__((reqd_work_group_size(128, 1, 1)))
void k(__global const uint4* a, __global const uint4* b, __global float* out) {{
    __local uint4 As[{64 * k // 8}];
    __local uint4 Bs[{n * k // 8}];
    const uint tid = get_local_id(0), lane = tid % 32u, w = tid / 32u;
    for (uint i = tid; i < {64 * k // 8}u; i += 128u) As[i] = a[i];
    for (uint i = tid; i < {n * k // 8}u; i += 128u) Bs[i] = b[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint abase = (uint)(size_t)As, bbase = (uint)(size_t)Bs;
    float {", ".join(f"d{i} = 0.0f" for i in range(nacc))};
    wg_fence();
{steps}
    wg_commit();
    wg_wait0();
    {" ".join(stores)}
}}
"""


def stage_layout():
    rng = np.random.default_rng(0)
    for n, k, trans_b in ((8, 16, 0), (64, 64, 0), (64, 64, 1), (256, 32, 1)):
        a = rng.integers(-3, 4, (64, k)).astype(np.float32)
        b = rng.integers(-3, 4, (k, n)).astype(np.float32)
        packed_b = pack_n_major(to_bf16_bits(b)) if trans_b else pack_k_major(to_bf16_bits(b.T.copy()))
        kernel = cl.Kernel(build(layout_kernel(n, k, trans_b)), "k")
        abuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=pack_k_major(to_bf16_bits(a)))
        bbuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=packed_b)
        obuf = cl.Buffer(ctx, mf.READ_WRITE, 64 * n * 4)
        kernel(q, (128,), (128,), abuf, bbuf, obuf)
        got = np.empty((64, n), np.float32)
        cl.enqueue_copy(q, got, obuf)
        ok = np.array_equal(got, a.astype(np.float64) @ b.astype(np.float64))
        print(f"layout m64n{n}k16, K {k}, trans-b {trans_b}: {'equal to numpy' if ok else 'WRONG'}", flush=True)


def best_of_5(kernel, size, local, *args):
    best = 1e9
    for _ in range(5):
        q.finish()
        t0 = time.perf_counter()
        kernel(q, size, local, *args)
        q.finish()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_wgmma(n=256, reps=512, groups=132 * 4, warp_groups=2):
    nacc = n // 2
    threads = 128 * warp_groups
    src = HELPERS + f"""
__kernel __attribute__((reqd_work_group_size({threads}, 1, 1)))
void k(__global float* out) {{
    __local uint4 As[{64 * 64 // 8}];
    __local uint4 Bs[{n * 64 // 8}];
    for (uint i = get_local_id(0); i < {64 * 64 // 8}u; i += {threads}u) As[i] = (uint4)(0x3f803f80u);
    for (uint i = get_local_id(0); i < {n * 64 // 8}u; i += {threads}u) Bs[i] = (uint4)(0x3f803f80u);
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint abase = (uint)(size_t)As, bbase = (uint)(size_t)Bs;
    float {", ".join(f"d{i} = 0.0f" for i in range(nacc))};
    for (uint r = 0; r < {reps}u; ++r) {{
        wg_fence();
        #pragma unroll
        for (uint s = 0; s < 4u; ++s) {{
            const ulong da = gdesc(abase + s * 2048u, 1024u, 128u), db = gdesc(bbase + s * {2 * n * 16}u, {n * 16}u, 128u);
            {wgmma_asm(n, 0)}
        }}
        wg_commit();
        wg_wait0();
    }}
    out[get_global_id(0)] = {" + ".join(f"d{i}" for i in range(nacc))};
}}
"""
    kernel = cl.Kernel(build(src), "k")
    ob = cl.Buffer(ctx, mf.READ_WRITE, groups * threads * 4)
    seconds = best_of_5(kernel, (groups * threads,), (threads,), ob)
    o = np.empty(groups * threads, np.float32)
    cl.enqueue_copy(q, o, ob)
    flops = 2 * 64 * n * 16 * 4 * reps * warp_groups * groups
    print(f"peak wgmma m64n{n}k16, {warp_groups} warp groups per work-group: {flops / seconds / 1e12:.0f} TFLOP/s "
          f"(sum {o[0]}, want {float(nacc) * reps * 4 * 16})", flush=True)


def peak_mma(reps=2048, groups=132 * 4, warps=8):
    chains = range(16)
    src = r"""
#define MMA(c0, c1, c2, c3) asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 " \
    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" : "=f"(c0), "=f"(c1), "=f"(c2), "=f"(c3) \
    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3))
__kernel void k(__global float* out, __global const uint* in) {
    uint a0 = in[0], a1 = in[1], a2 = in[2], a3 = in[3], b0 = in[4], b1 = in[5];
    """ + "\n    ".join(f"float c{i}_0 = 0.0f, c{i}_1 = 0.0f, c{i}_2 = 0.0f, c{i}_3 = 0.0f;" for i in chains) + f"""
    for (uint r = 0; r < {reps}u; ++r) {{
        """ + "\n        ".join(f"MMA(c{i}_0, c{i}_1, c{i}_2, c{i}_3);" for i in chains) + """
    }
    out[get_global_id(0)] = """ + " + ".join(f"c{i}_0 + c{i}_3" for i in chains) + """;
}
"""
    kernel = cl.Kernel(cl.Program(ctx, src).build(), "k")
    ib = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.full(8, 0x3f803f80, np.uint32))
    ob = cl.Buffer(ctx, mf.READ_WRITE, groups * 32 * warps * 4)
    seconds = best_of_5(kernel, (groups * 32 * warps,), (32 * warps,), ob, ib)
    flops = 2 * 16 * 8 * 16 * len(chains) * reps * warps * groups
    print(f"peak mma.sync m16n8k16, {warps} warps per work-group: {flops / seconds / 1e12:.0f} TFLOP/s", flush=True)


def stage_localmem():
    src = ("__kernel void k(__global float* o, __local float* s) "
           "{ s[get_local_id(0)] = 1.0f; barrier(CLK_LOCAL_MEM_FENCE); o[get_local_id(0)] = s[0]; }")
    kernel = cl.Kernel(cl.Program(ctx, src).build(), "k")
    ob = cl.Buffer(ctx, mf.READ_WRITE, 1024)
    for kib in (47, 48, 64, 100, 160, 227):
        try:
            kernel(q, (32,), (32,), ob, cl.LocalMemory(kib * 1024))
            q.finish()
            print(f"localmem {kib} KiB: accepted", flush=True)
        except cl.Error as e:
            print(f"localmem {kib} KiB: {e}", flush=True)


for stage in sys.argv[1:]:
    if stage == "layout":
        stage_layout()
    elif stage == "peak":
        peak_mma()
        peak_wgmma(256)
        peak_wgmma(128)
        peak_wgmma(256, warp_groups=1)
    elif stage == "localmem":
        stage_localmem()

"""The inline PTX of the tensor-core matmuls, emulated in OpenCL C, so their generated kernels run
on a CPU device (``emulated(spec, ...)``): ``cp.async`` as a plain 16-byte copy, ``ldmatrix``
(plain and ``.trans``) and ``mma.sync`` (m16n8k16 bf16/f16 with f32 sums, m16n8k32 s8/u8 with s32
sums) as warp-wide exchanges through local memory between work-group barriers, ``prmt`` in C.

The fragment layouts are written from the PTX ISA's tables ("Matrix Fragments for mma.m16n8k16"
and "... mma.m16n8k32", "ldmatrix"), apart from the kernels' own reasoning, so a kernel that
gives a wrong operand to a lane fails here as it would on the GPU. What emulation cannot show:
timing, bank conflicts, and PTX the driver would refuse. A warp here is 32 consecutive
work-items of the work-group, as on NVIDIA's hardware.
"""

from __future__ import annotations

import re

from triodnn.kernels import matmul_mma, quantized_matmul_mma

_EMULATION = r"""
static inline void emu_cp_async16(__local uchar* sm, uint dst, ulong src, uint bytes) {
    __global const uchar* p = (__global const uchar*)src;
    for (uint i = 0; i < 16u; ++i) sm[dst + i] = bytes ? p[i] : (uchar)0;
}
static inline void emu_ldsm(__local uchar* sm, __local uint* emu, uint addr, uint* r0, uint* r1, uint* r2,
                            uint* r3, int trans) {
    const uint lid = get_local_id(0), lane = lid % 32u, warp = lid - lane;
    barrier(CLK_LOCAL_MEM_FENCE);
    emu[lid] = addr;  /* lane 8 j + r gives row r of matrix j */
    barrier(CLK_LOCAL_MEM_FENCE);
    uint out[4];
    for (uint j = 0; j < 4u; ++j) {
        if (!trans) {  /* lane: row lane / 4, 16-bit elements 2 (lane % 4) and + 1 */
            const uint row = emu[warp + 8u * j + lane / 4u];
            out[j] = (uint)sm[row + 4u * (lane % 4u)] | ((uint)sm[row + 4u * (lane % 4u) + 1u] << 8)
                   | ((uint)sm[row + 4u * (lane % 4u) + 2u] << 16) | ((uint)sm[row + 4u * (lane % 4u) + 3u] << 24);
        } else {  /* lane: column lane / 4 of rows 2 (lane % 4) and + 1 */
            const uint lo = emu[warp + 8u * j + 2u * (lane % 4u)], hi = emu[warp + 8u * j + 2u * (lane % 4u) + 1u];
            const uint c = 2u * (lane / 4u);
            out[j] = (uint)sm[lo + c] | ((uint)sm[lo + c + 1u] << 8) | ((uint)sm[hi + c] << 16)
                   | ((uint)sm[hi + c + 1u] << 24);
        }
    }
    *r0 = out[0]; *r1 = out[1]; *r2 = out[2]; *r3 = out[3];
    barrier(CLK_LOCAL_MEM_FENCE);
}
static inline void emu_share(__local uint* emu, uint a0, uint a1, uint a2, uint a3, uint b0, uint b1) {
    const uint lid = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    emu[6u * lid] = a0; emu[6u * lid + 1u] = a1; emu[6u * lid + 2u] = a2; emu[6u * lid + 3u] = a3;
    emu[6u * lid + 4u] = b0; emu[6u * lid + 5u] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
}
static inline float emu_half(uint h, int brain) {
    if (brain) return as_float(h << 16);
    const uint e = (h >> 10) & 31u, m = h & 1023u;
    const float v = e == 0u ? (float)m * 0x1p-24f : ldexp((float)(m | 1024u), (int)e - 25);
    return (h & 0x8000u) ? -v : v;
}
/* m16n8k16, 16-bit operands: A (row, k) in lane (row % 8) * 4 + (k % 8) / 2, register
   row / 8 + 2 (k / 8), half k % 2; B (k, col) in lane col * 4 + (k % 8) / 2, register k / 8;
   C: c0 (g, 2 t), c1 (g, 2 t + 1), c2 (g + 8, 2 t), c3 (g + 8, 2 t + 1). */
static inline void emu_mma16(__local uint* emu, float* c0, float* c1, float* c2, float* c3, uint a0, uint a1,
                             uint a2, uint a3, uint b0, uint b1, int brain) {
    const uint lid = get_local_id(0), lane = lid % 32u, warp = lid - lane;
    emu_share(emu, a0, a1, a2, a3, b0, b1);
    float* c[4] = {c0, c1, c2, c3};
    for (uint i = 0; i < 4u; ++i) {
        const uint row = lane / 4u + (i / 2u) * 8u, col = 2u * (lane % 4u) + i % 2u;
        float sum = 0.0f;
        for (uint k = 0; k < 16u; ++k) {
            const uint a = emu[6u * (warp + (row % 8u) * 4u + (k % 8u) / 2u) + row / 8u + 2u * (k / 8u)];
            const uint b = emu[6u * (warp + col * 4u + (k % 8u) / 2u) + 4u + k / 8u];
            sum += emu_half((a >> (16u * (k % 2u))) & 0xffffu, brain) * emu_half((b >> (16u * (k % 2u))) & 0xffffu, brain);
        }
        *c[i] += sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
/* m16n8k32, 8-bit operands: A (row, k) in lane (row % 8) * 4 + (k % 16) / 4, register
   row / 8 + 2 (k / 16), byte k % 4; B (k, col) in lane col * 4 + (k % 16) / 4, register k / 16. */
static inline int emu_byte(uint word, uint k, int is_signed) {
    const uint b = (word >> (8u * (k % 4u))) & 0xffu;
    return is_signed ? (int)(char)b : (int)b;
}
static inline void emu_mma8(__local uint* emu, int* c0, int* c1, int* c2, int* c3, uint a0, uint a1, uint a2,
                            uint a3, uint b0, uint b1, int a_signed, int b_signed) {
    const uint lid = get_local_id(0), lane = lid % 32u, warp = lid - lane;
    emu_share(emu, a0, a1, a2, a3, b0, b1);
    int* c[4] = {c0, c1, c2, c3};
    for (uint i = 0; i < 4u; ++i) {
        const uint row = lane / 4u + (i / 2u) * 8u, col = 2u * (lane % 4u) + i % 2u;
        int sum = 0;
        for (uint k = 0; k < 32u; ++k) {
            const uint a = emu[6u * (warp + (row % 8u) * 4u + (k % 16u) / 4u) + row / 8u + 2u * (k / 16u)];
            const uint b = emu[6u * (warp + col * 4u + (k % 16u) / 4u) + 4u + k / 16u];
            sum += emu_byte(a, k, a_signed) * emu_byte(b, k, b_signed);
        }
        *c[i] += sum;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
static inline uint prmt(uint a, uint b, uint selector) {
    const ulong both = (ulong)a | ((ulong)b << 32);
    uint d = 0;
    for (uint i = 0; i < 4u; ++i) d |= (uint)((both >> (8u * ((selector >> (4u * i)) & 7u))) & 0xffu) << (8u * i);
    return d;
}
#define cp_async16(dst, src, bytes) emu_cp_async16(SM, dst, src, bytes)
#define cp_async_commit()
#define cp_async_wait_0()
#define cp_async_wait_1()
#define cp_async_wait_2()
#define cp_async_wait_3()
#define ldsm_x4(addr, r0, r1, r2, r3) emu_ldsm(SM, EMU, addr, r0, r1, r2, r3, 0)
#define ldsm_x4_trans(addr, r0, r1, r2, r3) emu_ldsm(SM, EMU, addr, r0, r1, r2, r3, 1)
"""


def emulated(source: str, *, operands: tuple[str, str]) -> str:
    """``source`` (a ``matmul_mma`` or ``quantized_matmul_mma`` kernel of ``operands``, the
    src and weights types) with its PTX helpers replaced by the emulation above, and its two
    local stages placed in one local array the emulated addresses index."""
    a_type, b_type = operands
    if a_type in ("bf16", "f16"):
        ptx = matmul_mma._ptx_helpers(a_type)
        mma = (f"#define MMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) emu_mma16(EMU, &(c0), &(c1), &(c2), &(c3), "
               f"a0, a1, a2, a3, b0, b1, {int(a_type == 'bf16')})\n")
    else:
        ptx = quantized_matmul_mma._ptx(a_type, b_type)
        mma = (f"#define IMMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) emu_mma8(EMU, &(c0), &(c1), &(c2), &(c3), "
               f"a0, a1, a2, a3, b0, b1, {int(a_type == 's8')}, {int(b_type == 's8')})\n")
    if ptx not in source:
        raise ValueError("the kernel's PTX helpers are not the ones this emulation replaces")
    source = source.replace(ptx, _EMULATION + mma)
    stages = re.search(r"__local uint4 As\[(\d+)\];\s*__local uint4 Bs\[(\d+)\];", source)
    threads = int(re.search(r"reqd_work_group_size\((\d+),", source).group(1))
    a_uint4, b_uint4 = int(stages.group(1)), int(stages.group(2))
    source = source.replace(stages.group(0), (
        f"__local uint4 SMEM[{a_uint4 + b_uint4}]; __local uint EMU[{6 * threads}];\n"
        "    __local uchar* SM = (__local uchar*)SMEM;"))
    return source.replace("(uint)(size_t)As", "0u").replace("(uint)(size_t)Bs", f"{16 * a_uint4}u")

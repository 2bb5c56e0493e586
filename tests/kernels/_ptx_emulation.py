"""The inline PTX of the tensor-core matmuls, emulated in OpenCL C, so their generated kernels run
on a CPU device (``emulated(spec, ...)``): ``cp.async`` as a plain 16-byte copy, ``ldmatrix``
(plain and ``.trans``) and ``mma.sync`` (m16n8k16 bf16/f16 and m16n8k8 TF32 with f32 sums,
m16n8k32 s8/u8 with s32 sums) as warp-wide exchanges through local memory between work-group
barriers; ``prmt``, ``cvt.rna.tf32.f32`` and ``ld.shared`` in C.

The fragment layouts are written from the PTX ISA's tables ("Matrix Fragments for mma.m16n8k16"
"... mma.m16n8k8" and "... mma.m16n8k32", "ldmatrix"), apart from the kernels' own reasoning, so a kernel that
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
/* Element k of a register holding e elements (kind 0 f16, 1 bf16, 2 tf32, 3 u8, 4 s8). */
static inline float emu_element(uint word, uint k, uint e, int kind) {
    if (kind == 2) return as_float(word & 0xffffe000u);  /* the tensor cores read 19 bits */
    if (kind >= 3) {
        const uint b = (word >> (8u * (k % e))) & 0xffu;
        return kind == 4 ? (float)(char)b : (float)b;
    }
    const uint h = (word >> (16u * (k % e))) & 0xffffu;
    if (kind == 1) return as_float(h << 16);
    const uint x = (h >> 10) & 31u, m = h & 1023u;
    const float v = x == 0u ? (float)m * 0x1p-24f : ldexp((float)(m | 1024u), (int)x - 25);
    return (h & 0x8000u) ? -v : v;
}
/* Lane ``lane``'s accumulator i of m16n8k(8 e), e elements a register (4 bytes / element size):
   A (row, k) is in lane (row % 8) * 4 + (k % 4e) / e, register row / 8 + 2 (k / 4e); B (k, col)
   in lane col * 4 + (k % 4e) / e, register 4 + k / 4e (after emu_share's six words a lane);
   C: c0 (g, 2 t), c1 (g, 2 t + 1), c2 (g + 8, 2 t), c3 (g + 8, 2 t + 1). Exact for the tests'
   operands: every partial sum is an integer or a short binary fraction below 2^24. */
static inline float emu_dot(__local uint* emu, uint warp, uint lane, uint i, uint e, int a_kind, int b_kind) {
    const uint row = lane / 4u + (i / 2u) * 8u, col = 2u * (lane % 4u) + i % 2u;
    float sum = 0.0f;
    for (uint k = 0; k < 8u * e; ++k) {
        const uint a = emu[6u * (warp + (row % 8u) * 4u + (k % (4u * e)) / e) + row / 8u + 2u * (k / (4u * e))];
        const uint b = emu[6u * (warp + col * 4u + (k % (4u * e)) / e) + 4u + k / (4u * e)];
        sum += emu_element(a, k, e, a_kind) * emu_element(b, k, e, b_kind);
    }
    return sum;
}
static inline void emu_mma_f32(__local uint* emu, float* c0, float* c1, float* c2, float* c3, uint a0, uint a1,
                               uint a2, uint a3, uint b0, uint b1, uint e, int kind) {
    const uint lid = get_local_id(0), lane = lid % 32u, warp = lid - lane;
    emu_share(emu, a0, a1, a2, a3, b0, b1);
    *c0 += emu_dot(emu, warp, lane, 0u, e, kind, kind); *c1 += emu_dot(emu, warp, lane, 1u, e, kind, kind);
    *c2 += emu_dot(emu, warp, lane, 2u, e, kind, kind); *c3 += emu_dot(emu, warp, lane, 3u, e, kind, kind);
    barrier(CLK_LOCAL_MEM_FENCE);
}
static inline void emu_mma_s32(__local uint* emu, int* c0, int* c1, int* c2, int* c3, uint a0, uint a1, uint a2,
                               uint a3, uint b0, uint b1, int a_kind, int b_kind) {
    const uint lid = get_local_id(0), lane = lid % 32u, warp = lid - lane;
    emu_share(emu, a0, a1, a2, a3, b0, b1);
    *c0 += (int)emu_dot(emu, warp, lane, 0u, 4u, a_kind, b_kind); *c1 += (int)emu_dot(emu, warp, lane, 1u, 4u, a_kind, b_kind);
    *c2 += (int)emu_dot(emu, warp, lane, 2u, 4u, a_kind, b_kind); *c3 += (int)emu_dot(emu, warp, lane, 3u, 4u, a_kind, b_kind);
    barrier(CLK_LOCAL_MEM_FENCE);
}
/* cvt.rna.tf32.f32: to nearest, ties away from zero, on the 13 bits TF32 drops (finite values). */
static inline uint to_tf32(uint bits) { return (bits + 0x1000u) & 0xffffe000u; }
#define lds32(addr) (*(__local uint*)(SM + (addr)))
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


_WARP_EMULATION = r"""
static inline float emu_shfl_xor(__local uint* emu, float v, uint mask) {
    const uint lid = get_local_id(0), lane = lid % 32u, warp = lid - lane;
    barrier(CLK_LOCAL_MEM_FENCE);
    emu[lid] = as_uint(v);
    barrier(CLK_LOCAL_MEM_FENCE);
    const float r = as_float(emu[warp + (lane ^ mask)]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#define shfl_xor(v, mask) emu_shfl_xor(EMU, v, mask)
static inline uint emu_round16(float x, int brain) {
    if (brain) { const uint b = as_uint(x); return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16; }
    ushort h;
    vstore_half_rte(x, 0, (half*)&h);
    return h;
}
"""


def emulated(source: str, *, operands: tuple[str, str], extra: str = "") -> str:
    """``source`` (a ``matmul_mma``, ``quantized_matmul_mma`` or ``sdpa_mma`` kernel of
    ``operands``, the two products' operand types) with its PTX helpers replaced by the
    emulation above (``extra``: its warp helpers, ``sdpa_mma.warp_helpers``, replaced by the
    shuffle and rounding emulation), and its local arrays placed in one the emulated addresses
    index."""
    a_type, b_type = operands
    if a_type in ("f32", "bf16", "f16"):
        ptx = matmul_mma.ptx_helpers("tf32" if a_type == "f32" else a_type)
        e, kind = {"f32": (1, 2), "bf16": (2, 1), "f16": (2, 0)}[a_type]
        mma = (f"#define MMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) emu_mma_f32(EMU, &(c0), &(c1), &(c2), &(c3), "
               f"a0, a1, a2, a3, b0, b1, {e}u, {kind})\n")
    else:
        ptx = quantized_matmul_mma.ptx_helpers(a_type, b_type)
        kinds = {"u8": 3, "s8": 4}
        mma = (f"#define IMMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) emu_mma_s32(EMU, &(c0), &(c1), &(c2), &(c3), "
               f"a0, a1, a2, a3, b0, b1, {kinds[a_type]}, {kinds[b_type]})\n")
    if ptx not in source:
        raise ValueError("the kernel's PTX helpers are not the ones this emulation replaces")
    source = source.replace(ptx, _EMULATION + mma)
    if extra:
        brain = int(a_type == "bf16")
        source = source.replace(extra, _WARP_EMULATION + (
            f"#define pack2(lo, hi) (emu_round16(lo, {brain}) | (emu_round16(hi, {brain}) << 16))\n"))
    # The kernel's __local uint4 arrays, addressed through (uint)(size_t)NAME, become one array
    # whose byte offsets the emulated instructions take as addresses.
    arrays = re.findall(r"__local uint4 (\w+)\[(\d+)\];", source)
    threads = int(re.search(r"reqd_work_group_size\((\d+),", source).group(1))
    offset, first = 0, True
    for name, count in arrays:
        declaration = f"__local uint4 {name}[{count}];"
        replacement = (f"__local uint4 SMEM[{sum(int(c) for _, c in arrays)}]; __local uint EMU[{6 * threads}];\n"
                       "    __local uchar* SM = (__local uchar*)SMEM;") if first else ""
        source = source.replace(declaration, replacement).replace(f"(uint)(size_t){name}", f"{offset}u")
        offset, first = offset + 16 * int(count), False
    return source

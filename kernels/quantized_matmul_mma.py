"""Int8 matmul on NVIDIA tensor cores: s8/u8 operands, exact s32 sums, from OpenCL C (sm_80+).

The frame is ``matmul_mma``'s (``cp.async`` slabs into local memory, ``ldmatrix`` fragments,
``mma.sync`` per warp), counted in bytes: a 16-byte copy is 16 elements, and one
``mma.sync.aligned.m16n8k32.row.col.s32.{u8,s8}.{u8,s8}.s32`` multiplies 16 x 32 by 32 x 8.
An int8 fragment holds, per 32-bit register, the same bytes as a bf16 one, so ``ldmatrix``
loads src and K-contiguous weights as it loads bf16.

N-contiguous weights (K x N row-major, oneDNN's plain ``ab``) need a transpose of bytes, which
``ldmatrix.trans`` (16-bit) does not do. The kernel gives ``ldmatrix.trans`` the slab's rows in
the order k = 0 1 4 5 8 9 12 13 | 2 3 6 7 10 11 14 15 (+16 for the second half), so each lane
gets, per register, two k of two neighbouring columns, and two ``prmt`` make of a pair of
registers the 4-k fragments of an even and an odd column. The two 8-column MMA tiles of a
16-byte column block then hold its even and its odd columns: the epilogue stores them so.

Zero points leave the K loop as it is. ``sum (a - za)(w - zw) = sum a w - za sum_k w - zw sum_k a
+ K za zw``: the column sums of the weights come from one more MMA per 8 columns with a src of
ones, the row sums of src from one per 16 rows with weights of ones, only where a zero point
needs them. Sums wrap modulo 2^32 as the reference's int32 would not, but agree with it whenever
the result fits (``QuantizedMatmulDesc``: K up to 33025). The epilogue is the other int8
kernels' ``qm_epilogue``, so outputs equal the reference's exactly.
"""

from __future__ import annotations

import math

import attrs

from .._values._quantized_matmul_desc import QuantizedMatmulDesc
from ._spec import KernelConfig, KernelSpec
from .matmul_mma import LOCAL_MEMORY, MIN_SM, cp_async_helpers, first_filling

_CHUNK = 16  # bytes (elements) per cp.async
_KSTEP = 32  # K of one mma.sync m16n8k32
INT8 = ("s8", "u8")


@attrs.frozen
class Int8Tile:
    """``bm x bn`` dst per work-group, ``bk`` K per slab, ``wm x wn`` warps, ``stages`` slabs
    in local memory; rows padded by 16 bytes (``ldmatrix``'s 8 rows in 8 bank groups)."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int = 2

    @property
    def warp_rows(self) -> int:
        return self.bm // self.wm

    @property
    def warp_cols(self) -> int:
        return self.bn // self.wn

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}:w{self.wm}x{self.wn}:p{self.stages}"

    def a_stage(self) -> int:
        return self.bm * (self.bk + _CHUNK)

    def b_stage(self, k_major: bool) -> int:
        return self.bk * (self.bn + _CHUNK) if k_major else self.bn * (self.bk + _CHUNK)

    def local_bytes(self, k_major: bool) -> int:
        return self.stages * (self.a_stage() + self.b_stage(k_major))

    def check(self) -> None:
        ok = (self.warp_rows % 16 == 0 and self.warp_cols % 16 == 0 and self.bk % _KSTEP == 0
              and self.bm % self.wm == 0 and self.bn % self.wn == 0 and self.stages >= 2
              and (self.bm * self.bk // _CHUNK) % self.threads == 0
              and (self.bn * self.bk // _CHUNK) % self.threads == 0
              and max(self.local_bytes(True), self.local_bytes(False)) <= LOCAL_MEMORY)
        if not ok:
            raise ValueError(f"int8 tensor-core tile {self.name} does not fit the kernel's layout")


def _tile(name: str) -> Int8Tile:
    """``"128x128x64:w2x4:p2"`` -> Int8Tile."""
    sizes, warps, stages = name.split(":")
    bm, bn, bk = map(int, sizes.split("x"))
    wm, wn = map(int, warps[1:].split("x"))
    tile = Int8Tile(bm, bn, bk, wm, wn, int(stages[1:]))
    tile.check()
    return tile


# The bf16 kernel's tiles with twice the K per slab: the same bytes per slab, half the slabs.
TILES: dict[str, Int8Tile] = {name: _tile(name) for name in (
    "128x128x64:w2x4:p2",
    "64x128x64:w2x2:p2",
    "64x64x64:w2x2:p2",
    "32x64x64:w1x2:p3",
)}
PREFERENCE: tuple[str, ...] = tuple(TILES)
MIN_GROUPS = 128
# Whether ``quantized_matmul.generate`` picks this kernel by itself. Off until its tests and
# ``benchmarks/tune_int8_mma_tiles.py`` have run on an NVIDIA GPU: it was written in a session
# whose device time was spent, and an int8 product must not reach users unmeasured. Until then
# it runs where a tile is named (``generate(..., mma_tile=...)``: its tests, the tuning script).
CHOSEN = False


def _aligned(strides, dims) -> bool:
    return all(s % _CHUNK == 0 for s, d in zip(strides, dims) if d > 1)


def weights_k_major(desc: QuantizedMatmulDesc) -> bool | None:
    """True for N-contiguous weights, False for K-contiguous ones, where every 16-byte chunk
    the kernel copies is aligned and src is K-contiguous; None for a layout it does not read."""
    src, wei = desc.src, desc.weights
    k, n = src.dims[-1], wei.dims[-1]
    if k % _CHUNK or src.strides[-1] != 1 or not _aligned(src.strides[:-1], src.dims[:-1]):
        return None
    if wei.strides[-1] == 1 and n % _CHUNK == 0 and _aligned(wei.strides[:-1], wei.dims[:-1]):
        return True
    if wei.strides[-2] == 1 and _aligned(wei.strides[:-2] + wei.strides[-1:], wei.dims[:-2] + wei.dims[-1:]):
        return False
    return None


def applies(desc: QuantizedMatmulDesc, config: KernelConfig) -> bool:
    """Whether this kernel takes ``desc`` on ``config``'s device: NVIDIA sm_80+, the layouts
    above, dst at least 16 x 16."""
    m, n = desc.dst.dims[-2:]
    return (config.nvidia_sm >= MIN_SM and desc.src.dtype in INT8 and desc.weights.dtype in INT8
            and m >= 16 and n >= 16 and weights_k_major(desc) is not None)


def choose_tile(m: int, n: int, nbatch: int, config: KernelConfig) -> Int8Tile:
    fitting = [TILES[name] for name in PREFERENCE
               if TILES[name].threads <= config.local_size
               and max(TILES[name].local_bytes(True), TILES[name].local_bytes(False)) <= config.local_memory]
    return first_filling(fitting, m, n, nbatch, MIN_GROUPS)


def _ptx(a_type: str, b_type: str) -> str:
    return cp_async_helpers() + f"""static inline void ldsm_x4(uint addr, uint* r0, uint* r1, uint* r2, uint* r3) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];"
                 : "=r"(*r0), "=r"(*r1), "=r"(*r2), "=r"(*r3) : "r"(addr) : "memory");
}}
static inline void ldsm_x4_trans(uint addr, uint* r0, uint* r1, uint* r2, uint* r3) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];"
                 : "=r"(*r0), "=r"(*r1), "=r"(*r2), "=r"(*r3) : "r"(addr) : "memory");
}}
static inline uint prmt(uint a, uint b, uint selector) {{
    uint d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
    return d;
}}
#define IMMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) \\
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.{a_type}.{b_type}.s32" \\
                 " {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%10,%11,%12,%13}};" \\
                 : "=r"(c0), "=r"(c1), "=r"(c2), "=r"(c3) \\
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1), "r"(c2), "r"(c3))
"""


def generate(desc: QuantizedMatmulDesc, config: KernelConfig, head: str, params: str, call: str,
             args: tuple[str, ...], lay: dict, wzp: str | None, *, tile: Int8Tile | str | None = None) -> KernelSpec:
    """The kernel of ``desc`` (which ``applies``) around ``quantized_matmul``'s pieces: ``head``
    (helpers, tables and ``qm_epilogue``), the kernel ``params``, the epilogue's leading
    ``call`` arguments, the argument names, the layout ``lay`` and the weights' zero point as C
    (``"WZPS[nn]"``, a constant, or None for zero). ``tile`` overrides ``choose_tile``."""
    k_major = weights_k_major(desc)
    if k_major is None or not applies(desc, config):
        raise ValueError("the int8 tensor-core matmul needs s8/u8 src and weights in an aligned layout")
    m, n = desc.dst.dims[-2:]
    k = desc.src.dims[-1]
    nbatch = lay["nbatch"]
    sa, sb = lay["sa"], lay["sb"]
    if tile is None:
        tile = choose_tile(m, n, nbatch, config)
    elif isinstance(tile, str):
        tile = TILES[tile] if tile in TILES else _tile(tile)
    tile.check()
    bm, bn, bk, threads = tile.bm, tile.bn, tile.bk, tile.threads
    lda, ldb = bk + _CHUNK, (bn + _CHUNK) if k_major else (bk + _CHUNK)
    a_stage, b_stage = tile.a_stage(), tile.b_stage(k_major)
    mi_n, ni_n = tile.warp_rows // 16, tile.warp_cols // 8
    slabs = math.ceil(k / bk)
    a_chunks = bm * bk // _CHUNK // threads
    b_chunks = bn * bk // _CHUNK // threads
    src_zp = desc.src_zp
    col_sums, row_sums = src_zp != 0, wzp is not None

    setup = []
    for i in range(a_chunks):
        setup.append(f"const uint a_row{i} = (tid + {i * threads}u) / {bk // _CHUNK}u, "
                     f"a_k{i} = ((tid + {i * threads}u) % {bk // _CHUNK}u) * {_CHUNK}u;")
        setup.append(f"const ulong a_g{i} = off_a + min(m0 + a_row{i}, {m - 1}UL) * {sa[-2]}UL;")
        setup.append(f"const uint a_s{i} = a_row{i} * {lda}u + a_k{i};")
    for i in range(b_chunks):
        if k_major:  # slab rows are k, chunks run along N
            setup.append(f"const uint b_k{i} = (tid + {i * threads}u) / {bn // _CHUNK}u, "
                         f"b_n{i} = ((tid + {i * threads}u) % {bn // _CHUNK}u) * {_CHUNK}u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - _CHUNK}UL);")
            setup.append(f"const uint b_s{i} = b_k{i} * {ldb}u + b_n{i};")
        else:  # slab rows are n, chunks run along K
            setup.append(f"const uint b_n{i} = (tid + {i * threads}u) / {bk // _CHUNK}u, "
                         f"b_k{i} = ((tid + {i * threads}u) % {bk // _CHUNK}u) * {_CHUNK}u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - 1}UL) * {sb[-1]}UL;")
            setup.append(f"const uint b_s{i} = b_n{i} * {ldb}u + b_k{i};")

    tail = k % bk != 0

    def copy_slab(slab: str, stage: str) -> str:
        """cp.async of slab ``slab`` (K from slab * bk) into stage ``stage``; zero past K."""
        out = [f"{{ const uint k0 = ({slab}) * {bk}u;"]
        for i in range(a_chunks):
            kk = f"k0 + a_k{i}"
            size = f"(({kk}) < {k}u ? 16u : 0u)" if tail else "16u"
            at = f"a_g{i} + (ulong)min({kk}, {k - _CHUNK}u)" if tail else f"a_g{i} + {kk}"
            out.append(f"cp_async16(as_base + ({stage}) * {a_stage}u + a_s{i}, (ulong)(src + {at}), {size});")
        for i in range(b_chunks):
            kk = f"k0 + b_k{i}"
            size = f"(({kk}) < {k}u ? 16u : 0u)" if tail else "16u"
            if k_major:
                row = f"(ulong)min({kk}, {k - 1}u)" if tail else f"(ulong)({kk})"
                at = f"b_g{i} + {row} * {sb[-2]}UL"
            else:
                at = f"b_g{i} + (ulong)min({kk}, {k - _CHUNK}u)" if tail else f"b_g{i} + {kk}"
            out.append(f"cp_async16(bs_base + ({stage}) * {b_stage}u + b_s{i}, (ulong)(wei + {at}), {size});")
        out.append("}")
        return " ".join(out)

    # One 32-deep k step on stage ``cur``.
    step = []
    for mi in range(mi_n):
        step.append(f"ldsm_x4(as_base + cur * {a_stage}u + a_frag + {mi * 16 * lda}u + kk * 32u, "
                    f"&a{mi}_0, &a{mi}_1, &a{mi}_2, &a{mi}_3);")
    for nj in range(ni_n // 2):
        e, o = 2 * nj, 2 * nj + 1
        if k_major:
            # r0/r1: k 0-15 in the row order above, r2/r3: k 16-31; prmt picks the even
            # column's bytes (0x6420) and the odd column's (0x7531).
            address = f"bs_base + cur * {b_stage}u + b_frag + kk * {32 * ldb}u + {nj * 16}u"
            step.append(f"ldsm_x4_trans({address}, &t0, &t1, &t2, &t3);")
            step.append(f"b{e}_0 = prmt(t0, t1, 0x6420u); b{o}_0 = prmt(t0, t1, 0x7531u); "
                        f"b{e}_1 = prmt(t2, t3, 0x6420u); b{o}_1 = prmt(t2, t3, 0x7531u);")
        else:
            address = f"bs_base + cur * {b_stage}u + b_frag + {nj * 16 * ldb}u + kk * 32u"
            step.append(f"ldsm_x4({address}, &b{e}_0, &b{e}_1, &b{o}_0, &b{o}_1);")
    for mi in range(mi_n):
        for ni in range(ni_n):
            c = [f"c{mi}_{ni}_{r}" for r in range(4)]
            step.append(f"IMMA({', '.join(c)}, a{mi}_0, a{mi}_1, a{mi}_2, a{mi}_3, b{ni}_0, b{ni}_1);")
    if col_sums:  # src of ones: every row of s{ni} is the column sums of the weights so far
        for ni in range(ni_n):
            s = [f"s{ni}_{r}" for r in range(4)]
            step.append(f"IMMA({', '.join(s)}, ONES, ONES, ONES, ONES, b{ni}_0, b{ni}_1);")
    if row_sums:  # weights of ones: every column of t{mi} is the row sums of src so far
        for mi in range(mi_n):
            t = [f"q{mi}_{r}" for r in range(4)]
            step.append(f"IMMA({', '.join(t)}, a{mi}_0, a{mi}_1, a{mi}_2, a{mi}_3, ONES, ONES);")

    a_frag = f"(wr + lane % 16u) * {lda}u + (lane / 16u) * 16u"
    if k_major:
        # Lane l gives row (l % 8) of matrix l / 8: k = (r/2)*4 + r%2 + 2*(j%2) + 16*(j/2).
        b_frag = (f"(((lane % 8u) / 2u) * 4u + (lane % 2u) + ((lane / 8u) % 2u) * 2u + (lane / 16u) * 16u) * {ldb}u"
                  " + wc")
    else:  # rows n = lane % 8 + (lane / 16) * 8, bytes k from ((lane / 8) % 2) * 16
        b_frag = f"(wc + lane % 8u + (lane / 16u) * 8u) * {ldb}u + ((lane / 8u) % 2u) * 16u"

    # Accumulator (mi, ni, r): row wr + mi*16 + lane/4 + (r/2)*8; column wc + ni*8 + (lane%4)*2
    # + r%2, or, for N-contiguous weights, wc + (ni/2)*16 + (lane%4)*4 + (r%2)*2 + ni%2.
    stores = []
    for mi in range(mi_n):
        for ni in range(ni_n):
            for r in range(4):
                row = f"row0 + {mi * 16 + (r // 2) * 8}u"
                if k_major:
                    col = f"col0 + {(ni // 2) * 16 + (r % 2) * 2 + ni % 2}u"
                else:
                    col = f"col0 + {ni * 8 + r % 2}u"
                acc = f"c{mi}_{ni}_{r}"
                terms = [f"(uint){acc}"]
                if col_sums:
                    terms.append(f"- (uint)({src_zp}) * (uint)s{ni}_{r}")
                if row_sums:
                    terms.append(f"- (uint)({wzp}) * (uint)q{mi}_{r}")
                    if src_zp:
                        terms.append(f"+ (uint)({k * src_zp}) * (uint)({wzp})")
                stores.append(f"{{ const ulong mm = {row}, nn = {col}; if (mm < {m}UL && nn < {n}UL) "
                              f"qm_epilogue({call}mm, nn, (int)({' '.join(terms)})); }}")
    col0 = "n0 + wc + (lane % 4u) * 4u" if k_major else "n0 + wc + (lane % 4u) * 2u"

    frags = ", ".join([f"a{mi}_{j}" for mi in range(mi_n) for j in range(4)]
                      + [f"b{ni}_{j}" for ni in range(ni_n) for j in range(2)]
                      + (["t0", "t1", "t2", "t3"] if k_major else []))
    accs = [f"c{mi}_{ni}_{r} = 0" for mi in range(mi_n) for ni in range(ni_n) for r in range(4)]
    accs += [f"s{ni}_{r} = 0" for ni in range(ni_n) for r in range(4)] if col_sums else []
    accs += [f"q{mi}_{r} = 0" for mi in range(mi_n) for r in range(4)] if row_sums else []
    wait = tile.stages - 2
    source = head + _ptx(desc.src.dtype, desc.weights.dtype) + f"""#define ONES 0x01010101u
__kernel __attribute__((reqd_work_group_size({threads}, 1, 1)))
void quantized_matmul({params}) {{
    __local uint4 As[{tile.stages * a_stage // 16}];
    __local uint4 Bs[{tile.stages * b_stage // 16}];
    const uint as_base = (uint)(size_t)As, bs_base = (uint)(size_t)Bs;
    const uint tid = get_local_id(0), lane = tid % 32u, warp = tid / 32u;
    const uint wr = (warp / {tile.wn}u) * {tile.warp_rows}u, wc = (warp % {tile.wn}u) * {tile.warp_cols}u;
    const ulong m0 = get_group_id(1) * {bm}UL, n0 = get_group_id(0) * {bn}UL;
    {lay['offsets']}
    {(chr(10) + "    ").join(setup)}
    const uint a_frag = {a_frag}, b_frag = {b_frag};
    uint {frags};
    int {', '.join(accs)};
    #pragma unroll
    for (uint s = 0; s < {tile.stages - 1}u; ++s) {{
        if (s < {slabs}u) {copy_slab("s", "s")}
        cp_async_commit();
    }}
    for (uint t = 0; t < {slabs}u; ++t) {{
        cp_async_wait_{wait}();
        barrier(CLK_LOCAL_MEM_FENCE);
        {{ const uint nt = t + {tile.stages - 1}u;
        if (nt < {slabs}u) {copy_slab("nt", f"nt % {tile.stages}u")}
        cp_async_commit(); }}
        const uint cur = t % {tile.stages}u;
        #pragma unroll
        for (uint kk = 0; kk < {bk // _KSTEP}u; ++kk) {{
            {(chr(10) + "            ").join(step)}
        }}
    }}
    const ulong row0 = m0 + wr + lane / 4u, col0 = {col0};
    {(chr(10) + "    ").join(stores)}
}}
"""
    return KernelSpec(
        source=source, name="quantized_matmul", arg_names=args,
        global_size=(math.ceil(n / bn) * threads, math.ceil(m / bm), nbatch),
        local_size=(threads, 1, 1), impl=f"ocl:int8:mma:{tile.name}",
    )

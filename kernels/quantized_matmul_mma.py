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

from .._values._quantized_matmul_desc import QuantizedMatmulDesc
from ._spec import KernelConfig, KernelSpec
from .matmul_mma import (
    MIN_SM,
    MmaTile,
    choose_from,
    cp_async_helpers,
    ldmatrix_helpers,
    mma_kernel,
    operand_loads,
    parse_tile,
    resolve_tile,
    slab_copies,
    warp_products,
    weights_layout,
)

_CHUNK = 16  # bytes (elements) per cp.async
INT8 = ("s8", "u8")


# The bf16 kernel's tiles with twice the K per slab: the same bytes per slab, half the slabs.
TILES: dict[str, MmaTile] = {name: parse_tile(name, elem_bytes=1) for name in (
    "128x128x64:w2x4:p2",
    "64x128x64:w2x2:p2",
    "64x64x64:w2x2:p2",
    "32x64x64:w1x2:p3",
)}
PREFERENCE: tuple[str, ...] = tuple(TILES)
MIN_GROUPS = 128
# Whether ``quantized_matmul.generate`` picks this kernel by itself. Off until its tests and
# ``benchmarks/tune_int8_mma_tiles.py`` have run on an NVIDIA GPU: it was written in a session
# whose device time was spent. Its results are checked with its PTX emulated under Oclgrind
# (tests/kernels/test_tensor_core_emulation.py), but neither the driver's acceptance of its PTX
# nor its speed is. Until then it runs where a tile is named (``generate(..., mma_tile=...)``).
CHOSEN = False


def weights_k_major(desc: QuantizedMatmulDesc) -> bool | None:
    """``matmul_mma.weights_layout`` in 16-element chunks: True for N-contiguous weights, False
    for K-contiguous ones, None for a layout this kernel does not read."""
    return weights_layout(desc.src, desc.weights, _CHUNK)


def applies(desc: QuantizedMatmulDesc, config: KernelConfig) -> bool:
    """Whether this kernel takes ``desc`` on ``config``'s device: NVIDIA sm_80+, the layouts
    above, dst at least 16 x 16."""
    m, n = desc.dst.dims[-2:]
    return (config.nvidia_sm >= MIN_SM and desc.src.dtype in INT8 and desc.weights.dtype in INT8
            and m >= 16 and n >= 16 and weights_k_major(desc) is not None)


def choose_tile(m: int, n: int, nbatch: int, config: KernelConfig) -> MmaTile:
    return choose_from([TILES[name] for name in PREFERENCE], m, n, nbatch, config, MIN_GROUPS)


def ptx_helpers(a_type: str, b_type: str) -> str:
    """The inline-PTX wrappers the kernel calls: the copies and ``ldmatrix``, ``prmt``, and
    ``IMMA``, the m16n8k32 product of ``a_type`` by ``b_type`` (u8 or s8) into s32."""
    return cp_async_helpers() + ldmatrix_helpers() + f"""static inline uint prmt(uint a, uint b, uint selector) {{
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
             args: tuple[str, ...], lay: dict, wzp: str | None, *, tile: MmaTile | str | None = None) -> KernelSpec:
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
    tile = resolve_tile(tile, TILES, 1, lambda: choose_tile(m, n, nbatch, config))
    ldb = tile.bn + _CHUNK
    b_stage = tile.b_stage(k_major)
    mi_n, ni_n = tile.warp_rows // 16, tile.warp_cols // 8
    src_zp = desc.src_zp
    col_sums, row_sums = src_zp != 0, wzp is not None
    setup, copy_slab = slab_copies(tile, k_major, m, n, k, sa, sb)

    # One 32-deep k step on stage ``cur``.
    a_frag, b_frag, step, loads_b = operand_loads(tile, k_major)
    if k_major:
        # Lane l gives row (l % 8) of matrix l / 8: k = (r/2)*4 + r%2 + 2*(j%2) + 16*(j/2), so
        # t0/t1 hold k 0-15 and t2/t3 k 16-31 as the header says; prmt picks the even column's
        # bytes (0x6420) and the odd column's (0x7531).
        b_frag = (f"(((lane % 8u) / 2u) * 4u + (lane % 2u) + ((lane / 8u) % 2u) * 2u + (lane / 16u) * 16u) * {ldb}u"
                  " + wc")
        for nj in range(ni_n // 2):
            e, o = 2 * nj, 2 * nj + 1
            address = f"bs_base + cur * {b_stage}u + b_frag + kk * {32 * ldb}u + {nj * 16}u"
            step.append(f"ldsm_x4_trans({address}, &t0, &t1, &t2, &t3);")
            step.append(f"b{e}_0 = prmt(t0, t1, 0x6420u); b{o}_0 = prmt(t0, t1, 0x7531u); "
                        f"b{e}_1 = prmt(t2, t3, 0x6420u); b{o}_1 = prmt(t2, t3, 0x7531u);")
    step += loads_b + warp_products(tile, "IMMA")
    if col_sums:  # src of ones: every row of s{ni} is the column sums of the weights so far
        for ni in range(ni_n):
            s = [f"s{ni}_{r}" for r in range(4)]
            step.append(f"IMMA({', '.join(s)}, ONES, ONES, ONES, ONES, b{ni}_0, b{ni}_1);")
    if row_sums:  # weights of ones: every column of t{mi} is the row sums of src so far
        for mi in range(mi_n):
            t = [f"q{mi}_{r}" for r in range(4)]
            step.append(f"IMMA({', '.join(t)}, a{mi}_0, a{mi}_1, a{mi}_2, a{mi}_3, ONES, ONES);")

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

    accs = [f"c{mi}_{ni}_{r} = 0" for mi in range(mi_n) for ni in range(ni_n) for r in range(4)]
    accs += [f"s{ni}_{r} = 0" for ni in range(ni_n) for r in range(4)] if col_sums else []
    accs += [f"q{mi}_{r} = 0" for mi in range(mi_n) for r in range(4)] if row_sums else []
    return mma_kernel(
        tile, k_major, preamble=head + ptx_helpers(desc.src.dtype, desc.weights.dtype) + "#define ONES 0x01010101u\n",
        name="quantized_matmul", params=params, args=args, impl=f"ocl:int8:mma:{tile.name}", m=m, n=n, k=k,
        nbatch=nbatch, offsets=lay["offsets"], setup=setup, copy_slab=copy_slab, a_frag=a_frag, b_frag=b_frag,
        scratch=("t0", "t1", "t2", "t3") if k_major else (), accs=f"int {', '.join(accs)};", step=step, col0=col0,
        stores="\n    ".join(stores),
    )

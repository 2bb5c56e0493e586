"""Matmul forward on NVIDIA tensor cores: bf16 and f16 operands, f32 accumulation, from OpenCL C.

NVIDIA's OpenCL compiler takes inline PTX, so a kernel can issue the instructions CUDA's
tensor-core GEMMs are made of (sm_80 and later):

- ``cp.async.cg.shared.global`` copies 16 bytes from global to local memory without passing
  through registers, so the next K slab streams in while the tensor cores work on this one
  (``stages`` slabs in flight); a chunk past K is zero-filled by the copy itself (source size 0);
- ``ldmatrix.sync.aligned.m8n8.x4`` loads a warp's 16 x 16 operand fragment from local memory in
  one instruction (``.trans`` for weights stored K-major, i.e. N contiguous);
- ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`` multiplies a 16 x 16 by a 16 x 8
  fragment into 16 x 8 f32 accumulators.

A work-group of ``wm x wn`` warps computes a ``bm x bn`` tile of dst, each warp a
``bm / wm x bn / wn`` block of 16 x 8 accumulator tiles. Local rows are padded by 8 halves (16
bytes) so the 8 rows one ``ldmatrix`` phase reads fall in 8 different bank groups.

Layouts taken: src K-contiguous; weights N-contiguous (row-major K x N) or K-contiguous (a
transposed weights); rows, batch strides, K (and N for N-contiguous weights) multiples of 8
elements, so every 16-byte chunk is aligned and wholly inside or outside the tensor. Rows past M
and columns past N are clamped to the last chunk on load and never stored. Bias, post-ops,
output scale and the dst type are as the tiled kernel's epilogue applies them, to each
accumulator; pairs of neighbouring f32 or f16 outputs are stored as one access where no sum
post-op reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from .._values import _fpmath as fpmath
from .._values._matmul_desc import MatmulDesc
from .._values._memory_desc import MemoryDesc
from . import _dtype_io, _post_ops
from ._post_ops import aligned_strides, generate_scaled
from ._spec import KernelConfig, KernelSpec
from .matmul_gpu import batch_offsets, matmul_epilogue

# The tensor-core kernels need mma.sync with bf16 (sm_80, Ampere) and cp.async (sm_80).
MIN_SM = 80
MMA_TYPES = {"bf16": "bf16", "f16": "f16"}
_CHUNK = 8  # halves per 16-byte copy
# NVIDIA's OpenCL offers 48 KiB of local memory per work-group and places a kernel's arrays after
# a few bytes of its own (ptxas: 37,890 bytes for 37,888 declared), so a tile leaves a margin.
LOCAL_MEMORY = 48 * 1024 - 64


@attrs.frozen
class MmaTile:
    """``bm x bn`` dst per work-group, ``bk`` K per slab, ``wm x wn`` warps, ``stages`` slabs
    in local memory (``cp.async`` keeps ``stages - 1`` in flight), of ``elem_bytes``-byte
    operands (2: bf16/f16, 1: int8). Local rows are padded by one 16-byte chunk."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int = 2
    elem_bytes: int = 2

    @property
    def chunk(self) -> int:
        """Elements per 16-byte copy."""
        return 16 // self.elem_bytes

    @property
    def k_step(self) -> int:
        """K of one ``mma.sync`` (m16n8k16 for 16-bit operands, m16n8k32 for 8-bit)."""
        return 32 // self.elem_bytes

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
        """Elements of one src slab in local memory."""
        return self.bm * (self.bk + self.chunk)

    def b_stage(self, k_major: bool) -> int:
        return self.bk * (self.bn + self.chunk) if k_major else self.bn * (self.bk + self.chunk)

    def local_bytes(self, k_major: bool = True) -> int:
        return self.elem_bytes * self.stages * (self.a_stage() + self.b_stage(k_major))

    def check(self) -> None:
        ok = (self.warp_rows % 16 == 0 and self.warp_cols % 16 == 0 and self.bk % self.k_step == 0
              and self.bm % self.wm == 0 and self.bn % self.wn == 0 and self.stages >= 2
              and (self.bm * self.bk // self.chunk) % self.threads == 0
              and (self.bn * self.bk // self.chunk) % self.threads == 0
              and max(self.local_bytes(True), self.local_bytes(False)) <= LOCAL_MEMORY)
        if not ok:
            kind = "int8 tensor-core tile" if self.elem_bytes == 1 else "tensor-core tile"
            raise ValueError(f"{kind} {self.name} does not fit the kernel's layout")


def parse_tile(name: str, elem_bytes: int = 2) -> MmaTile:
    """``"128x128x32:w2x2:p2"`` -> MmaTile (checked)."""
    sizes, warps, stages = name.split(":")
    bm, bn, bk = map(int, sizes.split("x"))
    wm, wn = map(int, warps[1:].split("x"))
    tile = MmaTile(bm, bn, bk, wm, wn, int(stages[1:]), elem_bytes)
    tile.check()
    return tile


TILES: dict[str, MmaTile] = {name: parse_tile(name) for name in (
    "128x128x32:w2x2:p2",
    "128x128x32:w2x4:p2",
    "128x256x16:w2x4:p2",
    "256x128x16:w4x2:p2",
    "128x128x16:w2x2:p3",
    "64x128x32:w2x2:p2",
    "64x64x32:w2x2:p2",
    "32x64x32:w1x2:p3",
)}
# Largest first: the first giving MIN_GROUPS work-groups, else the one giving the most. Measured
# on an H200 (benchmarks/tune_mma_tiles.py, bf16 4096^3, TFLOP/s in two runs; torch 725-752):
# 128x128x32:w2x4:p2 275 / 260, 128x128x32:w2x2:p2 261 / 254, 128x128x16:w2x2 (p4 / p3) 264 / 246,
# 64x128x32:w2x2:p2 237 / 228, 128x256x16:w2x4 (p3 / p2) 240 / 169, 256x128x16:w4x2:p2 168 / 163,
# 64x64x32:w2x2:p2 174 / 168, 32x64x32:w1x2:p3 125 / 124. The small tiles keep the device busy
# where the large give few work-groups (64x1024x1024: 32x64x32 12.0 us, torch 20.4).
PREFERENCE: tuple[str, ...] = ("128x128x32:w2x4:p2", "64x128x32:w2x2:p2", "64x64x32:w2x2:p2", "32x64x32:w1x2:p3")
MIN_GROUPS = 128
# f32 operands as TF32 (mma.sync m16n8k8, each operand rounded by cvt.rna.tf32.f32): the bf16
# tiles' bytes per slab, so half their K, in preference order.
TF32_TILES: dict[str, MmaTile] = {name: parse_tile(name, elem_bytes=4) for name in (
    "128x128x16:w2x4:p2",
    "64x128x16:w2x2:p2",
    "64x64x16:w2x2:p2",
    "32x64x16:w1x2:p3",
)}
# Whether ``applies`` hands TF32-permitted f32 matmuls to the tensor cores. Off until
# test_matmul_mma.py's TF32 cases and tune_mma_tiles.py have run on an NVIDIA GPU: written in a
# session whose device time was spent, its results are checked only with its PTX emulated under
# Oclgrind (tests/kernels/test_tensor_core_emulation.py). Until then ``generate(..., tile=)``
# builds it, and f32 stays on the CUDA cores under every fpmath mode.
TF32_CHOSEN = False


def _chunk_aligned(strides: tuple[int, ...], dims: tuple[int, ...], chunk: int) -> bool:
    return all(s % chunk == 0 for s, d in zip(strides, dims) if d > 1)


def weights_layout(src: MemoryDesc, wei: MemoryDesc, chunk: int) -> bool | None:
    """Whether the weights are K-major (N contiguous: True) or K-contiguous (False), where src
    is K-contiguous and every copy of ``chunk`` elements (16 bytes) is aligned; None for a
    layout the tensor-core kernels do not read."""
    k, n = src.dims[-1], wei.dims[-1]
    if k % chunk or src.strides[-1] != 1 or not _chunk_aligned(src.strides[:-1], src.dims[:-1], chunk):
        return None
    if wei.strides[-1] == 1 and n % chunk == 0 and _chunk_aligned(wei.strides[:-1], wei.dims[:-1], chunk):
        return True
    if wei.strides[-2] == 1 and _chunk_aligned(wei.strides[:-2] + wei.strides[-1:], wei.dims[:-2] + wei.dims[-1:],
                                               chunk):
        return False
    return None


def weights_k_major(desc: MatmulDesc) -> bool | None:
    """``weights_layout`` of a bf16/f16 matmul (8-element chunks)."""
    return weights_layout(desc.src, desc.weights, _CHUNK)


def tf32_operands(desc: MatmulDesc) -> bool:
    """Whether ``desc`` multiplies f32 by f32 under an fpmath mode that allows TF32."""
    return desc.src.dtype == desc.weights.dtype == "f32" and fpmath.allows(desc.fpmath, "tf32")


def applies(desc: MatmulDesc, config: KernelConfig) -> bool:
    """Whether this kernel takes ``desc`` on ``config``'s device: NVIDIA sm_80+, src and weights
    both bf16 or both f16 (or f32 where ``desc.fpmath`` allows TF32, once ``TF32_CHOSEN``), the
    layouts above, and dst at least 16 x 16."""
    m, n = desc.dst.dims[-2:]
    if config.nvidia_sm < MIN_SM or m < 16 or n < 16:
        return False
    if desc.src.dtype in MMA_TYPES and desc.weights.dtype == desc.src.dtype:
        return weights_k_major(desc) is not None
    return TF32_CHOSEN and tf32_operands(desc) and weights_layout(desc.src, desc.weights, 4) is not None


def choose_tile(m: int, n: int, nbatch: int, config: KernelConfig, elem_bytes: int = 2) -> MmaTile:
    if elem_bytes == 4:
        return choose_from(list(TF32_TILES.values()), m, n, nbatch, config, MIN_GROUPS)
    return choose_from([TILES[name] for name in PREFERENCE], m, n, nbatch, config, MIN_GROUPS)


def choose_from(tiles: list[MmaTile], m: int, n: int, nbatch: int, config: KernelConfig, min_groups: int) -> MmaTile:
    """``first_filling`` of the ``tiles`` (in preference order) the device's work-group size and
    local memory take, whichever weights layout."""
    fitting = [t for t in tiles if t.threads <= config.local_size
               and max(t.local_bytes(True), t.local_bytes(False)) <= config.local_memory]
    return first_filling(fitting, m, n, nbatch, min_groups)


def first_filling(fitting: list, m: int, n: int, nbatch: int, min_groups: int):
    """The first of ``fitting`` (tiles with ``bm``, ``bn``, in preference order) giving
    ``min_groups`` work-groups over an ``nbatch x m x n`` dst, else the one giving the most
    (the smaller on a tie)."""
    groups = lambda t: math.ceil(m / t.bm) * math.ceil(n / t.bn) * nbatch  # noqa: E731
    for tile in fitting:
        if groups(tile) >= min_groups:
            return tile
    return max(fitting, key=lambda t: (groups(t), -t.bm * t.bn))


def work(desc: MatmulDesc, config: KernelConfig) -> tuple[int, int]:
    """Work-items of the chosen tile's work-groups and the K slabs each copies in turn, what
    ``matmul_skinny.prefers`` weighs: at 16 x 32768 x 1024 the 16 work-groups of 32 x 64 took 340
    µs on an H200 where torch took 30."""
    m, n = desc.dst.dims[-2:]
    nbatch = math.prod(desc.dst.dims[:-2])
    tile = choose_tile(m, n, nbatch, config, 4 if tf32_operands(desc) else 2)
    return math.ceil(m / tile.bm) * math.ceil(n / tile.bn) * nbatch * tile.threads, math.ceil(desc.src.dims[-1] / tile.bk)


def generate(desc: MatmulDesc, config: KernelConfig, *, tile: MmaTile | str | None = None) -> KernelSpec:
    """The tensor-core kernel of ``desc`` (which ``applies``); ``tile`` (an MmaTile or a name of
    ``TILES``) overrides ``choose_tile``."""
    desc.check_supported()
    return generate_scaled(lambda chain: mma_gemm(desc, chain, config, tile), desc.post_ops, desc.output_scale)


@attrs.frozen
class GemmOperands:
    """What the tensor-core kernels read of a matmul: whether the weights are K-major (N
    contiguous), the sizes, the batch count, src's and the weights' strides aligned to dst's
    dims, and the MMA operand type."""

    k_major: bool
    m: int
    k: int
    n: int
    nbatch: int
    sa: tuple[int, ...]
    sb: tuple[int, ...]
    mma_type: str


def gemm_operands(desc: MatmulDesc, kernel: str, *, tf32: bool = False) -> GemmOperands:
    """``desc``'s operands for a tensor-core kernel (``kernel`` names it in the error when
    ``desc`` is not bf16/f16, or with ``tf32`` f32 under a mode allowing TF32, in a layout it
    reads)."""
    if tf32 and tf32_operands(desc):
        k_major, mma_type = weights_layout(desc.src, desc.weights, 4), "tf32"
    else:
        k_major, mma_type = weights_k_major(desc), MMA_TYPES.get(desc.src.dtype, "")
        if desc.weights.dtype != desc.src.dtype:
            mma_type = ""
    if k_major is None or not mma_type:
        raise ValueError(f"the {kernel} needs bf16 or f16 src and weights"
                         f"{' (or f32 under fpmath tf32 or any)' if tf32 else ''} in an aligned layout")
    nd = len(desc.dst.dims)
    m, k = desc.src.dims[-2:]
    return GemmOperands(k_major, m, k, desc.weights.dims[-1], math.prod(desc.dst.dims[:-2]),
                        aligned_strides(desc.src.dims, desc.src.strides, nd),
                        aligned_strides(desc.weights.dims, desc.weights.strides, nd), mma_type)


def _bytes(tile: MmaTile, elements: str) -> str:
    """C of a byte offset from ``elements`` (an element count in C)."""
    return elements if tile.elem_bytes == 1 else f"({elements}) * {tile.elem_bytes}u"


def slab_copies(tile: MmaTile, k_major: bool, m: int, n: int, k: int, sa: tuple, sb: tuple
                ) -> tuple[list[str], Callable[[str, str], str]]:
    """The statements placing each thread's 16-byte copies (chunk ``c = tid + i * threads`` of
    a slab), and ``copy_slab(slab, stage)``: the ``cp.async`` of slab ``slab`` (K from ``slab *
    bk``) into local stage ``stage``, zero-filled past K. Rows past M and columns past N are
    clamped to the last chunk."""
    bm, bn, bk, threads, chunk = tile.bm, tile.bn, tile.bk, tile.threads, tile.chunk
    lda, ldb = bk + chunk, (bn + chunk) if k_major else (bk + chunk)
    a_stage, b_stage = tile.a_stage() * tile.elem_bytes, tile.b_stage(k_major) * tile.elem_bytes
    a_chunks = bm * bk // chunk // threads
    b_chunks = bn * bk // chunk // threads
    setup = []
    for i in range(a_chunks):
        setup.append(f"const uint a_row{i} = (tid + {i * threads}u) / {bk // chunk}u, "
                     f"a_k{i} = ((tid + {i * threads}u) % {bk // chunk}u) * {chunk}u;")
        setup.append(f"const ulong a_g{i} = off_a + min(m0 + a_row{i}, {m - 1}UL) * {sa[-2]}UL;")
        setup.append(f"const uint a_s{i} = {_bytes(tile, f'a_row{i} * {lda}u + a_k{i}')};")
    for i in range(b_chunks):
        if k_major:  # slab rows are k, chunks run along N
            setup.append(f"const uint b_k{i} = (tid + {i * threads}u) / {bn // chunk}u, "
                         f"b_n{i} = ((tid + {i * threads}u) % {bn // chunk}u) * {chunk}u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - chunk}UL);")
            setup.append(f"const uint b_s{i} = {_bytes(tile, f'b_k{i} * {ldb}u + b_n{i}')};")
        else:  # slab rows are n, chunks run along K
            setup.append(f"const uint b_n{i} = (tid + {i * threads}u) / {bk // chunk}u, "
                         f"b_k{i} = ((tid + {i * threads}u) % {bk // chunk}u) * {chunk}u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - 1}UL) * {sb[-1]}UL;")
            setup.append(f"const uint b_s{i} = {_bytes(tile, f'b_n{i} * {ldb}u + b_k{i}')};")
    tail = k % bk != 0

    def copy_slab(slab: str, stage: str) -> str:
        out = [f"{{ const uint k0 = ({slab}) * {bk}u;"]
        for i in range(a_chunks):
            kk = f"k0 + a_k{i}"
            size = f"(({kk}) < {k}u ? 16u : 0u)" if tail else "16u"
            src = f"a_g{i} + (ulong)min({kk}, {k - chunk}u)" if tail else f"a_g{i} + {kk}"
            out.append(f"cp_async16(as_base + ({stage}) * {a_stage}u + a_s{i}, (ulong)(src + {src}), {size});")
        for i in range(b_chunks):
            kk = f"k0 + b_k{i}"
            size = f"(({kk}) < {k}u ? 16u : 0u)" if tail else "16u"
            if k_major:
                row = f"(ulong)min({kk}, {k - 1}u)" if tail else f"(ulong)({kk})"
                src = f"b_g{i} + {row} * {sb[-2]}UL"
            else:
                src = f"b_g{i} + (ulong)min({kk}, {k - chunk}u)" if tail else f"b_g{i} + {kk}"
            out.append(f"cp_async16(bs_base + ({stage}) * {b_stage}u + b_s{i}, (ulong)(wei + {src}), {size});")
        out.append("}")
        return " ".join(out)

    return setup, copy_slab


def operand_loads(tile: MmaTile, k_major: bool) -> tuple[str, str | None, list[str], list[str]]:
    """The lane's ``ldmatrix`` bases (``a_frag``; ``b_frag``, None for K-major weights, whose
    fragments each kernel loads its own way) and, for one k step ``kk`` of stage ``cur``, the
    loads of the src fragments ``a<mi>_0..3`` and of K-contiguous weights' ``b<ni>_0..1``
    (16 rows of K-contiguous bytes each: the same bytes per register for 16- and 8-bit types)."""
    chunk, lda, ldb = tile.chunk, tile.bk + tile.chunk, tile.bk + tile.chunk
    a_stage, b_stage = tile.a_stage() * tile.elem_bytes, tile.b_stage(k_major) * tile.elem_bytes
    a_frag = _bytes(tile, f"(wr + lane % 16u) * {lda}u + (lane / 16u) * {chunk}u")
    loads_a = [f"ldsm_x4(as_base + cur * {a_stage}u + a_frag + {_bytes(tile, f'{mi * 16 * lda}u + kk * {tile.k_step}u')}, "
               f"&a{mi}_0, &a{mi}_1, &a{mi}_2, &a{mi}_3);" for mi in range(tile.warp_rows // 16)]
    if k_major:
        return a_frag, None, loads_a, []
    # rows n = lane % 8 + (lane / 16) * 8, columns k from ((lane / 8) % 2) * chunk
    b_frag = _bytes(tile, f"(wc + lane % 8u + (lane / 16u) * 8u) * {ldb}u + ((lane / 8u) % 2u) * {chunk}u")
    loads_b = []
    for nj in range(tile.warp_cols // 16):
        address = f"bs_base + cur * {b_stage}u + b_frag + {_bytes(tile, f'{nj * 16 * ldb}u + kk * {tile.k_step}u')}"
        loads_b.append(f"ldsm_x4({address}, &b{2 * nj}_0, &b{2 * nj}_1, &b{2 * nj + 1}_0, &b{2 * nj + 1}_1);")
    return a_frag, b_frag, loads_a, loads_b


def resolve_tile(tile: MmaTile | str | None, tiles: dict[str, MmaTile], elem_bytes: int,
                 choose: Callable[[], MmaTile]) -> MmaTile:
    """``tile`` as given (an MmaTile, a name of ``tiles`` or another name), else ``choose()``'s;
    checked, and ``ValueError`` unless it is for ``elem_bytes``-byte operands."""
    if tile is None:
        tile = choose()
    elif isinstance(tile, str):
        tile = tiles[tile] if tile in tiles else parse_tile(tile, elem_bytes)
    if tile.elem_bytes != elem_bytes:
        raise ValueError(f"tile {tile.name} is for {tile.elem_bytes}-byte operands; these take {elem_bytes}")
    tile.check()
    return tile


def warp_products(tile: MmaTile, macro: str) -> list[str]:
    """One ``macro`` product per 16 x 8 accumulator tile of a warp: ``c<mi>_<ni>_0..3`` from the
    fragments ``a<mi>_0..3`` and ``b<ni>_0..1``."""
    return [f"{macro}({', '.join(f'c{mi}_{ni}_{r}' for r in range(4))}, "
            f"a{mi}_0, a{mi}_1, a{mi}_2, a{mi}_3, b{ni}_0, b{ni}_1);"
            for mi in range(tile.warp_rows // 16) for ni in range(tile.warp_cols // 8)]


def mma_kernel(tile: MmaTile, k_major: bool, *, preamble: str, name: str, params: str, args: tuple[str, ...],
               impl: str, m: int, n: int, k: int, nbatch: int, offsets: str, setup: list[str],
               copy_slab: Callable[[str, str], str], a_frag: str, b_frag: str | None, scratch: tuple[str, ...] = (),
               accs: str, step: list[str], col0: str, stores: str) -> KernelSpec:
    """A tensor-core kernel around its parts: local stages, the fragment registers (``a``, ``b``
    and ``scratch``) with the lane's ``ldmatrix`` bases, the ``cp.async`` pipeline (``stages -
    1`` slabs in flight), ``step`` once per k step of each slab, then ``stores`` from ``row0``
    (the lane's first row) and ``col0``; one work-group per ``bm x bn`` tile of dst. ``b_frag``
    is ``operand_loads``'s, which leaves K-major weights' to the kernel: None is refused."""
    if b_frag is None:
        raise ValueError(f"{name}: K-major weights need the kernel's own fragment base (b_frag)")
    mi_n, ni_n = tile.warp_rows // 16, tile.warp_cols // 8
    frags = ", ".join([f"a{mi}_{j}" for mi in range(mi_n) for j in range(4)]
                      + [f"b{ni}_{j}" for ni in range(ni_n) for j in range(2)] + list(scratch))
    slabs = math.ceil(k / tile.bk)
    source = preamble + f"""__kernel __attribute__((reqd_work_group_size({tile.threads}, 1, 1)))
void {name}({params}) {{
    __local uint4 As[{tile.stages * tile.a_stage() * tile.elem_bytes // 16}];
    __local uint4 Bs[{tile.stages * tile.b_stage(k_major) * tile.elem_bytes // 16}];
    const uint as_base = (uint)(size_t)As, bs_base = (uint)(size_t)Bs;
    const uint tid = get_local_id(0), lane = tid % 32u, warp = tid / 32u;
    const uint wr = (warp / {tile.wn}u) * {tile.warp_rows}u, wc = (warp % {tile.wn}u) * {tile.warp_cols}u;
    const ulong m0 = get_group_id(1) * {tile.bm}UL, n0 = get_group_id(0) * {tile.bn}UL;
    {offsets}
    {(chr(10) + "    ").join(setup)}
    const uint a_frag = {a_frag}, b_frag = {b_frag};
    uint {frags};
    {accs}
    #pragma unroll
    for (uint s = 0; s < {tile.stages - 1}u; ++s) {{
        if (s < {slabs}u) {copy_slab("s", "s")}
        cp_async_commit();
    }}
    for (uint t = 0; t < {slabs}u; ++t) {{
        cp_async_wait_{tile.stages - 2}();
        barrier(CLK_LOCAL_MEM_FENCE);
        {{ const uint nt = t + {tile.stages - 1}u;
        if (nt < {slabs}u) {copy_slab("nt", f"nt % {tile.stages}u")}
        cp_async_commit(); }}
        const uint cur = t % {tile.stages}u;
        #pragma unroll
        for (uint kk = 0; kk < {tile.bk // tile.k_step}u; ++kk) {{
            {(chr(10) + "            ").join(step)}
        }}
    }}
    const ulong row0 = m0 + wr + lane / 4u, col0 = {col0};
    {stores}
}}
"""
    return KernelSpec(
        source=source, name=name, arg_names=args,
        global_size=(math.ceil(n / tile.bn) * tile.threads, math.ceil(m / tile.bm), nbatch),
        local_size=(tile.threads, 1, 1), impl=impl,
    )


def mma_gemm(desc: MatmulDesc, post_ops: tuple, config: KernelConfig, tile: MmaTile | str | None = None) -> KernelSpec:
    """The kernel of ``desc`` with the chain ``post_ops`` (the output scale leading)."""
    ops = gemm_operands(desc, "tensor-core matmul", tf32=True)
    k_major, m, k, n, nbatch, sa, sb = ops.k_major, ops.m, ops.k, ops.n, ops.nbatch, ops.sa, ops.sb
    eb = 4 if ops.mma_type == "tf32" else 2
    tile = resolve_tile(tile, TF32_TILES if eb == 4 else TILES, eb, lambda: choose_tile(m, n, nbatch, config, eb))

    bm, bn, bk = tile.bm, tile.bn, tile.bk
    ldb = (bn + tile.chunk) if k_major else (bk + tile.chunk)
    b_stage = tile.b_stage(k_major)
    mi_n, ni_n = tile.warp_rows // 16, tile.warp_cols // 8
    setup, copy_slab = slab_copies(tile, k_major, m, n, k, sa, sb)

    # One k step on stage ``cur``: fragments by ldmatrix, then mi_n x ni_n mma.
    a_frag, b_frag, step, loads_b = operand_loads(tile, k_major)
    if k_major and eb == 2:  # rows k = lane % 16, columns n from (lane / 16) * 8, transposed by ldmatrix
        b_frag = f"((lane % 16u) * {ldb}u + wc + (lane / 16u) * 8u) * 2u"
        for nj in range(ni_n // 2):
            address = f"bs_base + cur * {b_stage * 2}u + b_frag + (kk * {16 * ldb}u + {nj * 16}u) * 2u"
            step.append(f"ldsm_x4_trans({address}, &b{2 * nj}_0, &b{2 * nj}_1, &b{2 * nj + 1}_0, &b{2 * nj + 1}_1);")
    elif k_major:  # TF32: b0 is (k = lane % 4, n = lane / 4), b1 four k on; ldmatrix.trans moves 16-bit halves
        b_frag = f"((lane % 4u) * {ldb}u + wc + lane / 4u) * 4u"
        for ni in range(ni_n):
            for j in range(2):
                address = f"bs_base + cur * {b_stage * 4}u + b_frag + (kk * {8 * ldb}u + {j * 4 * ldb + ni * 8}u) * 4u"
                step.append(f"b{ni}_{j} = lds32({address});")
    step += loads_b
    if eb == 4:  # round each operand to TF32 (the tensor cores would drop its low 13 bits)
        step += [f"a{mi}_{j} = to_tf32(a{mi}_{j});" for mi in range(mi_n) for j in range(4)]
        step += [f"b{ni}_{j} = to_tf32(b{ni}_{j});" for ni in range(ni_n) for j in range(2)]
    step += warp_products(tile, "MMA")

    # Accumulator (mi, ni, r) is row wr + mi*16 + lane/4 + (r/2)*8, column wc + ni*8 + (lane%4)*2
    # + r%2 of the work-group's tile.
    ep = fragment_epilogue(desc, post_ops, bm, bn, mi_n, ni_n, lambda mi, ni, r: f"c{mi}_{ni}_{r}")
    accs = ", ".join(f"c{mi}_{ni}_{r} = 0.0f" for mi in range(mi_n) for ni in range(ni_n) for r in range(4))
    return mma_kernel(
        tile, k_major, preamble=ep.helpers + ptx_helpers(ops.mma_type) + f"#define M {m}UL\n#define N {n}UL\n",
        name="matmul_fwd", params=ep.params, args=ep.args, impl=f"ocl:gemm_mma:{tile.name}{':tf32' if eb == 4 else ''}",
        m=m, n=n, k=k, nbatch=nbatch, offsets=ep.offsets, setup=setup, copy_slab=copy_slab, a_frag=a_frag,
        b_frag=b_frag, accs=f"float {accs};", step=step, col0="n0 + wc + (lane % 4u) * 2u", stores=ep.stores,
    )


@attrs.frozen
class FragmentEpilogue:
    """What a tensor-core kernel's frame takes from the matmul around it: kernel parameters and
    argument names (src, weights, [bias], post-op operands, dst), helper functions, the batch's
    ``off_<key>`` statements and the statements storing every accumulator from ``row0`` / ``col0``
    (the lane's first row and column)."""

    params: str
    args: tuple[str, ...]
    helpers: str
    offsets: str
    stores: str


def fragment_epilogue(desc: MatmulDesc, post_ops: tuple, bm: int, bn: int, mi_n: int, ni_n: int,
                      acc: Callable[[int, int, int], str]) -> FragmentEpilogue:
    """The epilogue of ``mi_n x ni_n`` accumulator tiles of 16 x 8 per warp, laid out as
    ``mma.sync`` and ``wgmma`` leave them: ``acc(mi, ni, r)`` is the lane's value at row
    ``row0 + mi*16 + (r/2)*8``, column ``col0 + ni*8 + r%2``. Bias, the chain ``post_ops``
    (output scale leading) and the dst type are applied as the tiled kernel's epilogue applies
    them; pairs of neighbouring f32 or f16 outputs are stored as one access where no sum post-op
    reads them."""
    m, n = desc.dst.dims[-2:]
    batch = desc.dst.dims[:-2]
    nd = len(batch) + 2
    sa = aligned_strides(desc.src.dims, desc.src.strides, nd)
    sb = aligned_strides(desc.weights.dims, desc.weights.strides, nd)
    sd, dst_dtype = tuple(desc.dst.strides), desc.dst.dtype
    bias_dtype = desc.bias.dtype if desc.bias is not None else None
    sc = aligned_strides(desc.bias.dims, desc.bias.strides, nd) if desc.bias is not None else None
    po_strides = _post_ops.operand_strides(post_ops, nd)
    row_check, col_check = m % bm != 0, n % bn != 0
    pair_store = (dst_dtype in ("f32", "f16") and sd[-1] == 1 and n % 2 == 0
                  and all(s % 2 == 0 for s in sd[:-1]) and not any(e[0] == "sum" for e in post_ops))
    epilogue = matmul_epilogue(dst_dtype, bias_dtype, post_ops, sd, sc, po_strides, vec_store=False)
    at, value = epilogue.at, epilogue.value

    def pair(v0: str, v1: str) -> str:
        if dst_dtype == "f32":
            return f"*(__global float2*)(dst + {at('d', 'col')}) = (float2)({v0}, {v1});"
        return f"vstore_half2_rte((float2)({v0}, {v1}), 0, dst + {at('d', 'col')});"

    lines = []
    for mi in range(mi_n):
        for half in range(2):
            cols = []
            for ni in range(ni_n):
                acc0, acc1 = acc(mi, ni, 2 * half), acc(mi, ni, 2 * half + 1)
                col = f"col0 + {ni * 8}u"
                if pair_store:
                    body = f"{value(acc0, 'v0', 'col')} {value(acc1, 'v1', 'col + 1u')} {pair('v0', 'v1')}"
                    body = f"{{ const ulong col = {col}; {body} }}"
                    cols.append(f"if ({col} < N) {body}" if col_check else body)
                else:
                    for r, acc_r in ((0, acc0), (1, acc1)):
                        cc = f"{col} + {r}u"
                        body = (f"{{ const ulong col = {cc}; {value(acc_r, 'v', 'col')} "
                                f"{_dtype_io.store(dst_dtype, 'dst', at('d', 'col'), 'v')} }}")
                        cols.append(f"if ({cc} < N) {body}" if col_check else body)
            guard = "if (row < M) " if row_check else ""
            lines.append(f"{{ const ulong row = row0 + {mi * 16 + half * 8}u; {guard}{{ {epilogue.row_offsets('row')}\n        "
                         + "\n        ".join(cols) + "\n    } }")

    params = (f"{_dtype_io.param(desc.src.dtype, 'src', const=True)}, {_dtype_io.param(desc.weights.dtype, 'wei', const=True)},"
              + (f" {_dtype_io.param(bias_dtype, 'bias', const=True)}," if bias_dtype is not None else "")
              + f"{_post_ops.params(post_ops)}\n                {_dtype_io.param(dst_dtype, 'dst', const=False)}")
    loads = (dst_dtype,) + ((bias_dtype,) if bias_dtype is not None else ())
    helpers = _dtype_io.functions(loads=loads, stores=(dst_dtype,)) + _post_ops.functions(post_ops, ("float",))
    args = ("src", "weights") + (("bias",) if bias_dtype is not None else ()) + tuple(po_strides) + ("dst",)
    return FragmentEpilogue(params=params, args=args, helpers=helpers,
                            offsets=batch_offsets(batch, sa, sb, sd, sc, po_strides),
                            stores="\n    ".join(lines))


def cp_async_helpers() -> str:
    """``cp_async16`` (16 bytes, global to local, zero-filled past ``bytes``), its commit and
    waits of up to 3 pending groups, as inline PTX (sm_80+)."""
    wait = "\n".join(f'static inline void cp_async_wait_{n}(void) {{ asm volatile("cp.async.wait_group {n};" ::: "memory"); }}'
                     for n in range(4))
    return f"""static inline void cp_async16(uint dst, ulong src, uint bytes) {{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}}
static inline void cp_async_commit(void) {{ asm volatile("cp.async.commit_group;" ::: "memory"); }}
{wait}
"""


def ldmatrix_helpers() -> str:
    """``ldsm_x4`` and ``ldsm_x4_trans``: four 8 x 8 matrices of 16-bit elements from local
    memory into a warp's registers, as inline PTX (sm_75+)."""
    return """static inline void ldsm_x4(uint addr, uint* r0, uint* r1, uint* r2, uint* r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(*r0), "=r"(*r1), "=r"(*r2), "=r"(*r3) : "r"(addr) : "memory");
}
static inline void ldsm_x4_trans(uint addr, uint* r0, uint* r1, uint* r2, uint* r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(*r0), "=r"(*r1), "=r"(*r2), "=r"(*r3) : "r"(addr) : "memory");
}
"""


def ptx_helpers(mma_type: str) -> str:
    """The inline-PTX wrappers the kernel calls: the copies and ``ldmatrix``, and ``MMA``, the
    m16n8k16 (bf16, f16) or m16n8k8 (tf32, with ``lds32`` and ``to_tf32``) product into f32."""
    if mma_type == "tf32":
        return cp_async_helpers() + ldmatrix_helpers() + """static inline uint lds32(uint addr) {
    uint v;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
static inline uint to_tf32(uint bits) {
    uint v;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(v) : "f"(as_float(bits)));
    return v;
}
#define MMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) \\
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" \\
                 " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \\
                 : "=f"(c0), "=f"(c1), "=f"(c2), "=f"(c3) \\
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3))
"""
    return cp_async_helpers() + ldmatrix_helpers() + f"""#define MMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) \\
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{mma_type}.{mma_type}.f32" \\
                 " {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%10,%11,%12,%13}};" \\
                 : "=f"(c0), "=f"(c1), "=f"(c2), "=f"(c3) \\
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3))
"""

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

from .._values._matmul_desc import MatmulDesc
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
    in local memory (``cp.async`` keeps ``stages - 1`` in flight)."""

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

    def local_bytes(self, k_major: bool = True) -> int:
        return 2 * self.stages * (self.a_stage() + self.b_stage(k_major))

    def check(self) -> None:
        ok = (self.warp_rows % 16 == 0 and self.warp_cols % 16 == 0 and self.bk % 16 == 0
              and self.bm % self.wm == 0 and self.bn % self.wn == 0 and self.stages >= 2
              and (self.bm * self.bk // _CHUNK) % self.threads == 0
              and (self.bn * self.bk // _CHUNK) % self.threads == 0
              and max(self.local_bytes(True), self.local_bytes(False)) <= LOCAL_MEMORY)
        if not ok:
            raise ValueError(f"tensor-core tile {self.name} does not fit the kernel's layout")


def _tile(name: str) -> MmaTile:
    """``"128x128x32:w2x2:p2"`` -> MmaTile."""
    sizes, warps, stages = name.split(":")
    bm, bn, bk = map(int, sizes.split("x"))
    wm, wn = map(int, warps[1:].split("x"))
    tile = MmaTile(bm, bn, bk, wm, wn, int(stages[1:]))
    tile.check()
    return tile


TILES: dict[str, MmaTile] = {name: _tile(name) for name in (
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


def _chunk_aligned(strides: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return all(s % _CHUNK == 0 for s, d in zip(strides, dims) if d > 1)


def weights_k_major(desc: MatmulDesc) -> bool | None:
    """Whether the weights are K-major (N contiguous: True) or K-contiguous (False), where every
    16-byte chunk this kernel copies is aligned; None for a layout it does not read."""
    src, wei = desc.src, desc.weights
    k = src.dims[-1]
    n = wei.dims[-1]
    if k % _CHUNK or src.strides[-1] != 1 or not _chunk_aligned(src.strides[:-1], src.dims[:-1]):
        return None
    if wei.strides[-1] == 1 and n % _CHUNK == 0 and _chunk_aligned(wei.strides[:-1], wei.dims[:-1]):
        return True
    if wei.strides[-2] == 1 and _chunk_aligned(wei.strides[:-2] + wei.strides[-1:], wei.dims[:-2] + wei.dims[-1:]):
        return False
    return None


def applies(desc: MatmulDesc, config: KernelConfig) -> bool:
    """Whether this kernel takes ``desc`` on ``config``'s device: NVIDIA sm_80+, src and weights
    both bf16 or both f16, the layouts above, and dst at least 16 x 16."""
    m, n = desc.dst.dims[-2:]
    return (config.nvidia_sm >= MIN_SM and desc.src.dtype in MMA_TYPES and desc.weights.dtype == desc.src.dtype
            and m >= 16 and n >= 16 and weights_k_major(desc) is not None)


def choose_tile(m: int, n: int, nbatch: int, config: KernelConfig) -> MmaTile:
    fitting = [TILES[name] for name in PREFERENCE
               if TILES[name].threads <= config.local_size
               and max(TILES[name].local_bytes(True), TILES[name].local_bytes(False)) <= config.local_memory]
    return first_filling(fitting, m, n, nbatch, MIN_GROUPS)


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
    tile = choose_tile(m, n, nbatch, config)
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


def gemm_operands(desc: MatmulDesc, kernel: str) -> GemmOperands:
    """``desc``'s operands for a tensor-core kernel (``kernel`` names it in the error when
    ``desc`` is not bf16/f16 in a layout it reads)."""
    k_major = weights_k_major(desc)
    if k_major is None or desc.src.dtype not in MMA_TYPES or desc.weights.dtype != desc.src.dtype:
        raise ValueError(f"the {kernel} needs bf16 or f16 src and weights in an aligned layout")
    nd = len(desc.dst.dims)
    m, k = desc.src.dims[-2:]
    return GemmOperands(k_major, m, k, desc.weights.dims[-1], math.prod(desc.dst.dims[:-2]),
                        aligned_strides(desc.src.dims, desc.src.strides, nd),
                        aligned_strides(desc.weights.dims, desc.weights.strides, nd), MMA_TYPES[desc.src.dtype])


def mma_gemm(desc: MatmulDesc, post_ops: tuple, config: KernelConfig, tile: MmaTile | str | None = None) -> KernelSpec:
    """The kernel of ``desc`` with the chain ``post_ops`` (the output scale leading)."""
    ops = gemm_operands(desc, "tensor-core matmul")
    k_major, m, k, n, nbatch, sa, sb = ops.k_major, ops.m, ops.k, ops.n, ops.nbatch, ops.sa, ops.sb
    if tile is None:
        tile = choose_tile(m, n, nbatch, config)
    elif isinstance(tile, str):
        tile = TILES[tile] if tile in TILES else _tile(tile)
    tile.check()

    mma_type = ops.mma_type
    bm, bn, bk, threads = tile.bm, tile.bn, tile.bk, tile.threads
    lda, ldb = bk + _CHUNK, (bn + _CHUNK) if k_major else (bk + _CHUNK)
    a_stage, b_stage = tile.a_stage(), tile.b_stage(k_major)
    mi_n, ni_n = tile.warp_rows // 16, tile.warp_cols // 8
    slabs = math.ceil(k / bk)
    a_chunks = bm * bk // _CHUNK // threads
    b_chunks = bn * bk // _CHUNK // threads

    # Per-thread copy positions: chunk c = tid + i * threads of the slab.
    setup = []
    for i in range(a_chunks):
        setup.append(f"const uint a_row{i} = (tid + {i * threads}u) / {bk // _CHUNK}u, "
                     f"a_k{i} = ((tid + {i * threads}u) % {bk // _CHUNK}u) * {_CHUNK}u;")
        setup.append(f"const ulong a_g{i} = off_a + min(m0 + a_row{i}, {m - 1}UL) * {sa[-2]}UL;")
        setup.append(f"const uint a_s{i} = (a_row{i} * {lda}u + a_k{i}) * 2u;")
    for i in range(b_chunks):
        if k_major:  # slab rows are k, chunks run along N
            setup.append(f"const uint b_k{i} = (tid + {i * threads}u) / {bn // _CHUNK}u, "
                         f"b_n{i} = ((tid + {i * threads}u) % {bn // _CHUNK}u) * {_CHUNK}u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - _CHUNK}UL);")
            setup.append(f"const uint b_s{i} = (b_k{i} * {ldb}u + b_n{i}) * 2u;")
        else:  # slab rows are n, chunks run along K
            setup.append(f"const uint b_n{i} = (tid + {i * threads}u) / {bk // _CHUNK}u, "
                         f"b_k{i} = ((tid + {i * threads}u) % {bk // _CHUNK}u) * {_CHUNK}u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - 1}UL) * {sb[-1]}UL;")
            setup.append(f"const uint b_s{i} = (b_n{i} * {ldb}u + b_k{i}) * 2u;")

    def copy_slab(slab: str, stage: str) -> str:
        """cp.async of slab ``slab`` (K from slab * bk) into stage ``stage``; zero past K."""
        out = [f"{{ const uint k0 = ({slab}) * {bk}u;"]
        for i in range(a_chunks):
            kk = f"k0 + a_k{i}"
            tail = k % bk != 0
            size = f"(({kk}) < {k}u ? 16u : 0u)" if tail else "16u"
            src = f"a_g{i} + (ulong)min({kk}, {k - _CHUNK}u)" if tail else f"a_g{i} + {kk}"
            out.append(f"cp_async16(as_base + ({stage}) * {a_stage * 2}u + a_s{i}, (ulong)(src + {src}), {size});")
        for i in range(b_chunks):
            tail = k % bk != 0
            if k_major:
                kk = f"k0 + b_k{i}"
                size = f"(({kk}) < {k}u ? 16u : 0u)" if tail else "16u"
                row = f"(ulong)min({kk}, {k - 1}u)" if tail else f"(ulong)({kk})"
                src = f"b_g{i} + {row} * {sb[-2]}UL"
            else:
                kk = f"k0 + b_k{i}"
                size = f"(({kk}) < {k}u ? 16u : 0u)" if tail else "16u"
                src = f"b_g{i} + (ulong)min({kk}, {k - _CHUNK}u)" if tail else f"b_g{i} + {kk}"
            out.append(f"cp_async16(bs_base + ({stage}) * {b_stage * 2}u + b_s{i}, (ulong)(wei + {src}), {size});")
        out.append("}")
        return " ".join(out)

    # One 16-deep k step on stage ``cur``: fragments by ldmatrix, then mi_n x ni_n mma.
    step = []
    for mi in range(mi_n):
        step.append(f"ldsm_x4(as_base + cur * {a_stage * 2}u + a_frag + ({mi * 16 * lda}u + kk * 16u) * 2u, "
                    f"&a{mi}_0, &a{mi}_1, &a{mi}_2, &a{mi}_3);")
    for nj in range(ni_n // 2):
        if k_major:
            address = f"bs_base + cur * {b_stage * 2}u + b_frag + (kk * {16 * ldb}u + {nj * 16}u) * 2u"
            step.append(f"ldsm_x4_trans({address}, &b{2 * nj}_0, &b{2 * nj}_1, &b{2 * nj + 1}_0, &b{2 * nj + 1}_1);")
        else:
            address = f"bs_base + cur * {b_stage * 2}u + b_frag + ({nj * 16 * ldb}u + kk * 16u) * 2u"
            step.append(f"ldsm_x4({address}, &b{2 * nj}_0, &b{2 * nj}_1, &b{2 * nj + 1}_0, &b{2 * nj + 1}_1);")
    for mi in range(mi_n):
        for ni in range(ni_n):
            c = [f"c{mi}_{ni}_{r}" for r in range(4)]
            step.append(f"MMA({', '.join(c)}, a{mi}_0, a{mi}_1, a{mi}_2, a{mi}_3, b{ni}_0, b{ni}_1);")
    # ldmatrix addresses of this lane (bytes from a stage's start, before the k step).
    a_frag = f"((wr + lane % 16u) * {lda}u + (lane / 16u) * 8u) * 2u"
    if k_major:  # rows k = lane % 16, columns n from (lane / 16) * 8
        b_frag = f"((lane % 16u) * {ldb}u + wc + (lane / 16u) * 8u) * 2u"
    else:  # rows n = lane % 8 + (lane / 16) * 8, columns k from ((lane / 8) % 2) * 8
        b_frag = f"((wc + lane % 8u + (lane / 16u) * 8u) * {ldb}u + ((lane / 8u) % 2u) * 8u) * 2u"

    # Accumulator (mi, ni, r) is row wr + mi*16 + lane/4 + (r/2)*8, column wc + ni*8 + (lane%4)*2
    # + r%2 of the work-group's tile.
    ep = fragment_epilogue(desc, post_ops, bm, bn, mi_n, ni_n, lambda mi, ni, r: f"c{mi}_{ni}_{r}")
    frags = ", ".join([f"a{mi}_{j}" for mi in range(mi_n) for j in range(4)]
                      + [f"b{ni}_{j}" for ni in range(ni_n) for j in range(2)])
    accs = ", ".join(f"c{mi}_{ni}_{r} = 0.0f" for mi in range(mi_n) for ni in range(ni_n) for r in range(4))
    helpers = ep.helpers + _ptx_helpers(mma_type)
    wait = tile.stages - 2
    source = helpers + f"""#define M {m}UL
#define N {n}UL
__kernel __attribute__((reqd_work_group_size({threads}, 1, 1)))
void matmul_fwd({ep.params}) {{
    __local uint4 As[{tile.stages * a_stage // 8}];
    __local uint4 Bs[{tile.stages * b_stage // 8}];
    const uint as_base = (uint)(size_t)As, bs_base = (uint)(size_t)Bs;
    const uint tid = get_local_id(0), lane = tid % 32u, warp = tid / 32u;
    const uint wr = (warp / {tile.wn}u) * {tile.warp_rows}u, wc = (warp % {tile.wn}u) * {tile.warp_cols}u;
    const ulong m0 = get_group_id(1) * {bm}UL, n0 = get_group_id(0) * {bn}UL;
    {ep.offsets}
    {(chr(10) + "    ").join(setup)}
    const uint a_frag = {a_frag}, b_frag = {b_frag};
    uint {frags};
    float {accs};
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
        for (uint kk = 0; kk < {bk // 16}u; ++kk) {{
            {(chr(10) + "            ").join(step)}
        }}
    }}
    const ulong row0 = m0 + wr + lane / 4u, col0 = n0 + wc + (lane % 4u) * 2u;
    {ep.stores}
}}
"""
    return KernelSpec(
        source=source, name="matmul_fwd", arg_names=ep.args,
        global_size=(math.ceil(n / bn) * threads, math.ceil(m / bm), nbatch),
        local_size=(threads, 1, 1), impl=f"ocl:gemm_mma:{tile.name}",
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


def _ptx_helpers(mma_type: str) -> str:
    """The inline-PTX wrappers the kernel calls."""
    return cp_async_helpers() + f"""static inline void ldsm_x4(uint addr, uint* r0, uint* r1, uint* r2, uint* r3) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0,%1,%2,%3}}, [%4];"
                 : "=r"(*r0), "=r"(*r1), "=r"(*r2), "=r"(*r3) : "r"(addr) : "memory");
}}
static inline void ldsm_x4_trans(uint addr, uint* r0, uint* r1, uint* r2, uint* r3) {{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];"
                 : "=r"(*r0), "=r"(*r1), "=r"(*r2), "=r"(*r3) : "r"(addr) : "memory");
}}
#define MMA(c0, c1, c2, c3, a0, a1, a2, a3, b0, b1) \\
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{mma_type}.{mma_type}.f32" \\
                 " {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%10,%11,%12,%13}};" \\
                 : "=f"(c0), "=f"(c1), "=f"(c2), "=f"(c3) \\
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3))
"""

"""Matmul forward on GPUs: local-memory tiled SGEMM with 2D register blocking.

The design of Cedric Nugteren's "myGEMM" steps and CLBlast's xgemm, as CUDA SGEMMs do it: a
work-group of ``(BM / TM) x (BN / TN)`` work-items computes a ``BM x BN`` tile of dst, each
work-item a ``TM x TN`` block held in registers (TM, TN multiples of 4). K advances ``BK`` at a
time: the ``BM x BK`` slab of src and the ``BK x BN`` slab of weights are staged in __local
memory, both k-major (``As[k][m]``, ``Bs[k][n]``), so each k step reads ``TM / 4 + TN / 4`` float4
from local memory for ``TM * TN`` FMAs. A work-item's rows are ``TM / 4`` groups of 4 consecutive
rows spaced ``4 * BM / TM`` apart (columns likewise), so a warp's float4 reads cover contiguous
local memory without bank conflicts; warps are 4 x 8 work-items where the work-group allows it.

Double buffering: two local buffers; the next slab is loaded from global memory into registers
before the k steps on the current one and stored to the other buffer after them, one barrier per
slab. Global loads go in groups of 4 elements along the operand's contiguous dimension (K for a
row-major src or a transposed weights, M or N for the other layouts), one float4 (ushort4 for
bf16, ...) access where strides and extents keep every group 16-byte aligned, element by element
otherwise. A slab loaded along K is stored transposed, its local rows padded by 4 floats against
bank conflicts.

K split inside the work-group (tiles named ``…:sN``, for small M x N): N groups of work-items
each run the loop above on their own slab buffers over one N-th of K (K a multiple of N * BK);
groups 1.. leave their accumulators in local memory and group 0 adds them (in group order) and
alone runs the epilogue, so more work-items share each dst tile without a second pass.

Edges: rows of src and columns of weights past M or N are clamped to the last one (their results
are computed and never stored); the K tail slab reads zeros past K. Shapes are baked, so a problem
that divides into tiles has no checks at all. Bias, post-ops (the sum post-op reads dst) and
storage types as ``matmul``: f32 math, every element converted as it is loaded and stored; the
epilogue computes each output on its own and stores f32 rows of 4 as one float4 where aligned.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from .._values._matmul_desc import MatmulDesc
from . import _dtype_io, _post_ops
from ._post_ops import aligned_strides, generate_scaled
from ._spec import KernelConfig, KernelSpec, index_code


@attrs.frozen
class Tile:
    """One tile configuration: ``bm x bn`` dst per work-group, ``bk`` K per slab, ``tm x tn`` per
    work-item."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    ks: int = 1  # K splits inside the work-group: ks groups of items work-items, summed at the end

    @property
    def lm(self) -> int:
        return self.bm // self.tm

    @property
    def ln(self) -> int:
        return self.bn // self.tn

    @property
    def items(self) -> int:
        return self.lm * self.ln

    @property
    def threads(self) -> int:
        return self.items * self.ks

    @property
    def name(self) -> str:
        split = f":s{self.ks}" if self.ks > 1 else ""
        return f"{self.bm}x{self.bn}x{self.bk}:r{self.tm}x{self.tn}:l{self.ln}x{self.lm}{split}"

    def local_bytes(self) -> int:
        return 2 * self.bk * (self.bm + self.bn + 8) * 4 * self.ks

    def check(self) -> None:
        ok = (
            self.tm % 4 == 0 and self.tn % 4 == 0 and self.bk % 4 == 0
            and self.bm % self.tm == 0 and self.bn % self.tn == 0
            and (self.bm * self.bk // 4) % self.items == 0 and (self.bn * self.bk // 4) % self.items == 0
            and self.local_bytes() <= 48 * 1024
            and self.ks >= 1
            # the partial sums of splits 1.. fit in the split buffers of A (rows padded or not)
            and (self.ks - 1) * self.tm * self.tn * self.items <= self.ks * 2 * self.bk * self.bm
        )
        if not ok:
            raise ValueError(f"tile {self.name} does not fit the kernel's layout")


def _tile(name: str) -> Tile:
    """``"128x128x16:r8x8"`` (or ``"32x32x16:r4x4:s4"``, K split 4 ways) -> Tile."""
    sizes, regs, *split = name.split(":")
    bm, bn, bk = map(int, sizes.split("x"))
    tm, tn = map(int, regs[1:].split("x"))
    tile = Tile(bm, bn, bk, tm, tn, int(split[0][1:]) if split else 1)
    tile.check()
    return tile


# Tile configurations by name, largest first. gemm_check.py (.device/) times each on the GPU.
TILES: dict[str, Tile] = {name: _tile(name) for name in (
    "128x128x16:r8x8",
    "128x128x8:r8x8",
    "128x64x16:r8x8",
    "64x128x16:r8x8",
    "64x64x16:r8x8",
    "64x64x16:r4x4",
    "32x64x16:r4x4",
    "64x32x16:r4x4",
    "32x64x32:r4x4",
    "32x32x16:r4x4",
    "32x32x32:r4x4",
    "16x64x32:r4x4",
    "32x32x16:r4x4:s4",
    "32x64x16:r4x4:s2",
    "64x32x16:r4x4:s2",
    "128x16x32:r4x4",
    "64x16x16:r4x4:s4",
)}

# The default choice: the first of these (largest first) giving at least MIN_GROUPS work-groups,
# else the one giving the most. Measured on an H200 (132 SMs, NVIDIA OpenCL), TFLOP/s at M=N=K
# 1024 / 2048 / 4096: 128x128x8:r8x8 21.8 / 45.9 / 46.6, 128x128x16:r8x8 22.0 / 45.5 / 46.2,
# 128x64x16:r8x8 38.3 / 41.0 / 46.3, 64x128x16:r8x8 37.1 / 41.1 / 46.2, 64x64x16:r8x8 35.9 / 42.4 /
# 43.2, 64x64x16:r4x4 30.7 / 32.1 / 32.9, 128x256x8:r8x16 11.5 / 41.9 / 42.9 (torch fp32, TF32 off:
# 29.8 / 47.1 / 50.6): the larger tile wins once there are about as many work-groups as SMs.
PREFERENCE: tuple[str, ...] = ("128x128x8:r8x8", "128x64x16:r8x8", "64x64x16:r8x8", "64x64x16:r4x4")
MIN_GROUPS = 128
# Small dst (M = 64, N = 1024: 16 work-groups of the tiles above for 132 SMs): tiles of 16-32 rows,
# 4 x 4 per work-item, taken in this order where the PREFERENCE tiles give fewer than MIN_GROUPS
# work-groups: the first giving MIN_GROUPS, else the one giving the most (ties: the first).
# Measured on the H200 at M=64, N=K=1024 (device us, median of 100; torch fp32 TF32 off 14.8):
# 128x64x16:r8x8 (the choice before) 57.8, 64x64x16:r4x4 40.0, 32x64x16:r4x4 33.5, 32x64x32:r4x4
# 23.7, 32x32x32:r4x4 25.0, 16x64x32:r4x4 26.3, 32x32x16:r4x4:s4 19.7, 32x64x16:r4x4:s2 25.5.
# Split tiles (``:sN``: N groups of work-items share a dst tile, each over K / N, summed through
# local memory) only where K divides into N slabs; among all, where none gives MIN_GROUPS, the most
# work-items in all wins (ties: the first).
SMALL_PREFERENCE: tuple[str, ...] = ("32x32x16:r4x4:s4", "32x64x16:r4x4:s2", "32x64x32:r4x4", "32x32x32:r4x4",
                                     "16x64x32:r4x4")


# Narrow dst (N of 13-16, M of 128 or more: a tall-skinny product, e.g. a projection to 16
# features): 16-column tiles, taken in this order as SMALL_PREFERENCE's are. Measured on an H200
# (benchmarks/tune_matmul_tiles.py, device us, median of 7 samples of 20 runs; torch fp32 TF32 off): 65536x1024x16
# 128x16x32:r4x4 108 against 505 for the 4 x 4 register blocks before (torch 197); 16384x1024x16
# 45 against the K-split skinny kernel's 60 (64x16x16:r4x4:s4 35; torch 64); 65536x256x16 32
# against 119 (torch 38). 128x16x16:r8x4, 64x16x16:r4x4, 128x16x32:r8x4 and 256x16x16:r16x4 were
# 1.1-2.6x slower than these. At N = 24 (8192x4096x24) two 16-column tiles were 0.23-0.68x torch,
# behind the skinny kernel (0.54x), so N past 16 keeps the kernels it had.
NARROW_PREFERENCE: tuple[str, ...] = ("128x16x32:r4x4", "64x16x16:r4x4:s4")
NARROW_COLUMNS = (13, 16)  # N range of the narrow tiles: at most a quarter of their columns idle
NARROW_MIN_ROWS = 128


def _narrow(m: int, n: int) -> bool:
    return NARROW_COLUMNS[0] <= n <= NARROW_COLUMNS[1] and m >= NARROW_MIN_ROWS


def applies(m: int, n: int, config: KernelConfig) -> bool:
    """Whether ``matmul.generate`` hands this problem to this generator: GPU shape (vector width
    1), work-groups of 64+, local memory for the smallest PREFERENCE tile, and dst at least 32 x 32
    and 64 x 64 elements in all, or narrow (NARROW_PREFERENCE)."""
    smallest = min(TILES[name].local_bytes() for name in PREFERENCE)
    return (config.vector_width == 1 and config.local_size >= 64 and config.local_memory >= smallest
            and (m >= 32 and n >= 32 and m * n >= 64 * 64 or _narrow(m, n)))


def splits_k(tile: Tile, k: int) -> bool:
    """Whether ``tile`` takes a problem of this K: a split tile needs K in whole slabs per split."""
    return tile.ks == 1 or k % (tile.ks * tile.bk) == 0


def choose_tile(m: int, n: int, nbatch: int, config: KernelConfig, k: int | None = None) -> Tile:
    groups = lambda t: math.ceil(m / t.bm) * math.ceil(n / t.bn) * nbatch  # noqa: E731
    fits = lambda t: t.threads <= config.local_size and t.local_bytes() <= config.local_memory  # noqa: E731
    if _narrow(m, n):
        narrow = [TILES[name] for name in NARROW_PREFERENCE if fits(TILES[name])
                  and (k is not None and splits_k(TILES[name], k) or TILES[name].ks == 1)]
        for tile in narrow:
            if groups(tile) >= MIN_GROUPS:
                return tile
        if narrow:
            return max(narrow, key=lambda t: (groups(t) * t.threads, groups(t)))
    fitting = [TILES[name] for name in PREFERENCE if fits(TILES[name])]
    for tile in fitting:
        if groups(tile) >= MIN_GROUPS:
            return tile
    small = [TILES[name] for name in SMALL_PREFERENCE if fits(TILES[name])
             and (k is not None and splits_k(TILES[name], k) or TILES[name].ks == 1)]
    for tile in small:
        if groups(tile) >= MIN_GROUPS:
            return tile
    return max(fitting + small, key=lambda t: (groups(t) * t.threads, groups(t)))


# Group loads of 4 elements as one access: the vector type read and its conversion to float4.
_WIDE = {
    "f32": lambda p, o: f"(*(__global const float4*)({p} + {o}))",
    "bf16": lambda p, o: f"as_float4(convert_uint4(*(__global const ushort4*)({p} + {o})) << 16)",
    "f16": lambda p, o: f"vload_half4(0, {p} + {o})",
    "s32": lambda p, o: f"convert_float4(*(__global const int4*)({p} + {o}))",
    "s8": lambda p, o: f"convert_float4(*(__global const char4*)({p} + {o}))",
    "u8": lambda p, o: f"convert_float4(*(__global const uchar4*)({p} + {o}))",
}


class _Operand:
    """How one input's slab moves from global to local memory.

    ``ext``: the operand's M (or N) extent; ``s_mn``, ``s_k``: its strides along that dimension
    and K; ``bt``: the tile's extent along M (or N); ``batch``: its batch strides."""

    def __init__(self, name: str, ptr: str, local: str, dtype: str, ext: int, k: int,
                 s_mn: int, s_k: int, batch: tuple[int, ...], bt: int, tile: Tile):
        self.name, self.ptr, self.local, self.dtype = name, ptr, local, dtype
        self.ext, self.k, self.s_mn, self.s_k, self.bt, self.bk = ext, k, s_mn, s_k, bt, tile.bk
        # Groups of 4 run along K when K is the contiguous dimension (or neither is), else along M/N.
        self.along_k = s_k == 1 or s_mn != 1
        run_ext = k if self.along_k else ext
        other = (s_mn if self.along_k else s_k,) + tuple(batch)
        self.wide = (
            dtype in _WIDE and (s_k if self.along_k else s_mn) == 1 and run_ext % 4 == 0
            and all(s % 4 == 0 for s in other)
        )
        self.pad = 4 if self.along_k else 0
        self.stride = bt + self.pad  # floats per local row (one k)
        self.groups = tile.bk * bt // 4 // tile.items  # groups of 4 per work-item per slab

    def slab_position(self, g: int, items: int) -> str:
        """The declaration of group ``g``'s place in the slab, ``{name}_mn{g}`` and ``{name}_k{g}``:
        consecutive work-items take consecutive groups along the run (K, or M/N)."""
        per_row = self.bk // 4 if self.along_k else self.bt // 4
        lin, name = f"({g * items}u + lid)", self.name
        if self.along_k:
            return f"const uint {name}_mn{g} = {lin} / {per_row}u, {name}_k{g} = ({lin} % {per_row}u) * 4u;"
        return f"const uint {name}_k{g} = {lin} / {per_row}u, {name}_mn{g} = ({lin} % {per_row}u) * 4u;"

    def setup(self, base: str, off: str, items: int) -> str:
        """Per-work-item constants: the slab position of each of its groups and its global offset
        at k = 0 (rows past the extent clamped to the last)."""
        lines = []
        for g in range(self.groups):
            lines.append(self.slab_position(g, items))
            if self.along_k or self.wide:
                # One row (along K), or a whole aligned group (along M/N: extent % 4 == 0).
                last = self.ext - 1 if self.along_k else self.ext - 4
                pos = f"{base} + {self.name}_mn{g}"
                if self.ext % self.bt:
                    pos = f"min({pos}, {last}UL)"
                lines.append(f"const ulong {self.name}_o{g} = {off} + ({pos}) * {self.s_mn}UL + {self.name}_k{g} * {self.s_k}UL;")
            else:
                for c in range(4):
                    pos = f"{base} + {self.name}_mn{g} + {c}u"
                    if self.ext % self.bt:
                        pos = f"min({pos}, {self.ext - 1}UL)"
                    lines.append(f"const ulong {self.name}_o{g}_{c} = {off} + ({pos}) * {self.s_mn}UL"
                                 f" + {self.name}_k{g} * {self.s_k}UL;")
        return "\n    ".join(lines)

    def load(self, k0: str, tail: bool) -> str:
        """Statements loading the slab at ``k0`` into the registers ``{name}_r{g}``; ``tail``:
        zeros past K."""
        out = []
        kk = f"({k0}) * {self.s_k}UL"
        for g in range(self.groups):
            reg = f"{self.name}_r{g}"
            if self.wide:
                value = _WIDE[self.dtype](self.ptr, f"{self.name}_o{g} + {kk}")
                if tail:  # along K: the group is all in or all past K (K % 4 == 0)
                    value = f"({k0} + {self.name}_k{g} < {self.k}u) ? {value} : (float4)(0.0f)"
                out.append(f"{reg} = {value};")
                continue
            elems = []
            for c in range(4):
                if self.along_k:
                    offset = f"{self.name}_o{g} + {kk} + {c * self.s_k}UL"
                    kc = f"{k0} + {self.name}_k{g} + {c}u"
                else:
                    offset = f"{self.name}_o{g}_{c} + {kk}"
                    kc = f"{k0} + {self.name}_k{g}"
                value = _dtype_io.load(self.dtype, self.ptr, offset)
                if tail:
                    value = f"(({kc} < {self.k}u) ? {value} : 0.0f)"
                elems.append(value)
            out.append(f"{reg} = (float4)({', '.join(elems)});")
        return " ".join(out)

    def store(self, buf: str) -> str:
        """Statements storing the registers into local buffer ``buf`` (a float offset)."""
        out = []
        for g in range(self.groups):
            reg = f"{self.name}_r{g}"
            if self.along_k:
                out += [f"{self.local}[{buf} + ({self.name}_k{g} + {c}u) * {self.stride}u + {self.name}_mn{g}] = {reg}.s{c};"
                        for c in range(4)]
            else:
                out.append(f"*(__local float4*)({self.local} + {buf} + {self.name}_k{g} * {self.stride}u"
                           f" + {self.name}_mn{g}) = {reg};")
        return " ".join(out)


def generate(desc: MatmulDesc, config: KernelConfig, *, tile: Tile | str | None = None) -> KernelSpec:
    """The tiled kernel of ``desc`` whatever ``applies`` says (``matmul.generate`` dispatches);
    ``tile`` (a Tile or a name of ``TILES``) overrides ``choose_tile``."""
    desc.check_supported()
    return generate_scaled(lambda chain: tiled(desc, chain, config, tile), desc.post_ops, desc.output_scale)


def tiled(desc: MatmulDesc, post_ops: tuple, config: KernelConfig, tile: Tile | str | None = None) -> KernelSpec:
    """The kernel of ``desc`` with the chain ``post_ops`` (the output scale leading, as
    ``generate_scaled`` hands it); ValueError for a ``tile`` that does not fit or split K."""
    src_dims, src_strides, src_dtype = desc.src.dims, desc.src.strides, desc.src.dtype
    wei_dims, wei_strides, wei_dtype = desc.weights.dims, desc.weights.strides, desc.weights.dtype
    dst_strides, dst_dtype = desc.dst.strides, desc.dst.dtype
    bias_dims = None if desc.bias is None else desc.bias.dims
    bias_dtype = "f32" if desc.bias is None else desc.bias.dtype
    m, k = src_dims[-2:]
    n = wei_dims[-1]
    batch = desc.dst.dims[:-2]  # the broadcast batch dims (the descriptor checked them)
    nd = len(batch) + 2
    nbatch = math.prod(batch)
    sa = aligned_strides(src_dims, src_strides, nd)
    sb = aligned_strides(wei_dims, wei_strides, nd)
    sd = tuple(dst_strides)
    has_bias = bias_dims is not None
    sc = aligned_strides(desc.bias.dims, desc.bias.strides, nd) if desc.bias is not None else (0,) * nd
    po_strides = _post_ops.operand_strides(post_ops, nd)

    if tile is None:
        tile = choose_tile(m, n, nbatch, config, k)
    elif isinstance(tile, str):
        tile = TILES[tile] if tile in TILES else _tile(tile)
    tile.check()
    if not splits_k(tile, k):
        raise ValueError(f"tile {tile.name} needs K a multiple of {tile.ks * tile.bk}; K is {k}")
    offsets = batch_offsets(batch, sa, sb, sd, sc if has_bias else None, po_strides)

    a = _Operand("a", "src", "As", src_dtype, m, k, sa[-2], sa[-1], sa[:-2], tile.bm, tile)
    b = _Operand("b", "wei", "Bs", wei_dtype, n, k, sb[-1], sb[-2], sb[:-2], tile.bn, tile)
    if tile.ks == 1:
        a_off, b_off = "off_a", "off_b"
    else:
        kpart = k // tile.ks
        a_off, b_off = f"(off_a + (ulong)kg * {kpart * sa[-1]}UL)", f"(off_b + (ulong)kg * {kpart * sb[-2]}UL)"
    epilogue = matmul_epilogue(
        dst_dtype, bias_dtype if has_bias else None, post_ops, sd, sc if has_bias else None, po_strides,
        vec_store=dst_dtype == "f32" and sd[-1] == 1 and n % 4 == 0 and all(s % 4 == 0 for s in sd[:-1]),
    )
    return gemm_kernel(
        name="matmul_fwd", m=m, n=n, k=k, tile=tile, a=a, b=b, offsets=offsets, a_off=a_off, b_off=b_off,
        epilogue=epilogue, nbatch=nbatch, impl=f"ocl:gemm_tiled:{tile.name}",
    )


@attrs.frozen
class Epilogue:
    """What the tiled kernel does with each finished output (row, col): ``acc + bias``, the
    post-op chain, the store as ``dst_dtype``.

    Each tensor the epilogue touches has a key: ``d`` (dst), ``c`` (bias), the binary post-op
    operands' names. An element's offset is ``off_<key> + ro_<key> + col * col_strides[key]``:
    ``off_<key>`` comes from the kernel's batch offsets, ``ro_<key>`` from ``row_offsets(row)``
    (C statements defining it for every key; a matmul multiplies, a convolution decodes the row
    into an image and an output position). ``vec_store``: dst rows of 4 f32 are stored as one
    float4 (the caller checked alignment); ``vec_store_rows``: four rows of a column are, their
    offsets consecutive (M % 4 == 0; a convolution's NCHW dst, whose positions are its rows)."""

    dst_dtype: str
    bias_dtype: str | None  # None: no bias
    post_ops: tuple
    col_strides: dict
    row_offsets: Callable[[str], str]
    vec_store: bool
    vec_store_rows: bool = False

    @property
    def operands(self) -> tuple[str, ...]:
        """The binary post-op operands' keys, in argument order."""
        return tuple(key for key in self.col_strides if key not in ("d", "c"))

    def at(self, key: str, col: str) -> str:
        """The offset of tensor ``key``'s element in column ``col`` of the current row."""
        return f"off_{key} + ro_{key} + ({col}) * {self.col_strides[key]}UL"

    def value(self, acc: str, var: str, col: str) -> str:
        """C statements defining float ``var``, the output of accumulator ``acc`` in column
        ``col``: bias added, the post-op chain applied (not yet stored)."""
        bias = f" + {_dtype_io.load(self.bias_dtype, 'bias', self.at('c', col))}" if self.bias_dtype is not None else ""
        post = _dtype_io.apply_post_ops_scalar(self.post_ops, var, self.at("d", col),
                                               {key: self.at(key, col) for key in self.operands}, self.dst_dtype)
        return f"float {var} = {acc}{bias}; {post}"


def batch_offsets(batch: tuple[int, ...], sa: tuple[int, ...], sb: tuple[int, ...], sd: tuple[int, ...],
                  sc: tuple[int, ...] | None, po_strides: dict) -> str:
    """C statements defining ``off_<key>`` of a batched matmul's tensors (src ``a``, weights
    ``b``, dst ``d``, bias ``c`` unless ``sc`` is None, the post-op operands) from
    ``get_group_id(2)``; ``s*`` are their strides aligned to dst's dims."""
    strides = {"a": sa[:-2], "b": sb[:-2], "d": sd[:-2]}
    if sc is not None:
        strides["c"] = sc[:-2]
    strides.update({name: s[:-2] for name, s in po_strides.items()})
    if batch:
        return index_code(batch, strides, "get_group_id(2)")
    return " ".join(f"const ulong off_{name} = 0;" for name in strides)


def matmul_epilogue(dst_dtype: str, bias_dtype: str | None, post_ops: tuple, sd: tuple[int, ...],
                    sc: tuple[int, ...] | None, po_strides: dict, *, vec_store: bool) -> Epilogue:
    """The epilogue of a matmul's dst rows: every tensor's row and column strides are its two
    last aligned strides (``sc`` None: no bias)."""
    with_bias = {"c": sc} if sc is not None else {}
    tensors = {"d": sd} | with_bias | po_strides
    row_strides = {key: s[-2] for key, s in tensors.items()}
    return Epilogue(
        dst_dtype=dst_dtype, bias_dtype=bias_dtype, post_ops=post_ops,
        col_strides={key: s[-1] for key, s in tensors.items()},
        row_offsets=lambda row: " ".join(f"const ulong ro_{t} = {row} * {s}UL;" for t, s in row_strides.items()),
        vec_store=vec_store,
    )


def gemm_kernel(*, name: str, m: int, n: int, k: int, tile: Tile, a: _Operand, b: _Operand, offsets: str,
                a_off: str, b_off: str, epilogue: Epilogue, nbatch: int, impl: str) -> KernelSpec:
    """The tiled kernel around two operands (``_Operand`` or a subclass that gathers, as an implicit
    GEMM does) and an epilogue: ``offsets`` defines ``off_<key>`` for every tensor from
    ``get_group_id(2)`` (the batch); ``a_off`` / ``b_off`` are where the operands start (a split
    tile's ``kg`` may appear in them). Arguments: src, weights, [bias], the binary post-op
    operands (the epilogue's other keys, in order), dst; their types are the operands' and the
    epilogue's."""
    bm, bn, bk, tm, tn, lm, ln, items = tile.bm, tile.bn, tile.bk, tile.tm, tile.tn, tile.lm, tile.ln, tile.items
    ks, threads = tile.ks, tile.threads
    kpart = k // ks  # K of each split
    slabs, full = math.ceil(kpart / bk), kpart // bk  # slabs in all; those without a K tail

    def load(k0: str, slab: str) -> str:
        body = lambda tail: a.load(k0, tail) + "\n        " + b.load(k0, tail)  # noqa: E731
        if full == slabs:
            return body(False)
        if full == 0:
            return body(True)
        return f"if ({slab} < {full}u) {{\n        {body(False)}\n        }} else {{\n        {body(True)}\n        }}"

    # k steps on one slab: TM/4 + TN/4 float4 reads from local memory, TM * TN FMAs.
    a4, b4 = a.stride // 4, b.stride // 4
    reads = [f"const float4 a{i} = As4[ab + k * {a4}u + {i * lm}u];" for i in range(tm // 4)]
    reads += [f"const float4 b{j} = Bs4[bb + k * {b4}u + {j * ln}u];" for j in range(tn // 4)]
    fmas = [f"c{i}_{j} = fma(a{i // 4}.s{i % 4}, b{j // 4}.s{j % 4}, c{i}_{j});" for i in range(tm) for j in range(tn)]
    step = "\n            ".join(reads + [" ".join(fmas[r * tn:(r + 1) * tn]) for r in range(tm)])

    # Epilogue: output (i, j) of the work-item is row ty*4 + (i/4)*4*LM + i%4, column likewise.
    ep = epilogue
    row_check, col_check = m % bm != 0, n % bn != 0
    po_names = ep.operands
    has_bias = ep.bias_dtype is not None
    params = (f"{_dtype_io.param(a.dtype, 'src', const=True)}, {_dtype_io.param(b.dtype, 'wei', const=True)},"
              + (f" {_dtype_io.param(ep.bias_dtype, 'bias', const=True)}," if ep.bias_dtype is not None else "")
              + f"{_post_ops.params(ep.post_ops)}\n                {_dtype_io.param(ep.dst_dtype, 'dst', const=False)}")
    loads = (a.dtype, b.dtype, ep.dst_dtype) + ((ep.bias_dtype,) if ep.bias_dtype is not None else ())
    helpers = (_dtype_io.functions(loads=loads, stores=(ep.dst_dtype,))
               + _post_ops.functions(ep.post_ops, ("float",)))
    args = ("src", "weights") + (("bias",) if has_bias else ()) + po_names + ("dst",)

    at = ep.at

    def value(i: int, j: int, var: str, col: str) -> str:
        return ep.value(f"c{i}_{j}", var, col)

    lines = []
    for ig in range(tm // 4 if ep.vec_store_rows else 0):  # four rows of a column per float4
        first = f"row0 + {ig * 4 * lm}u"
        cols = []
        for j in range(tn):
            col = f"col0 + {(j // 4) * 4 * ln + j % 4}u"
            rows = " ".join(f"{{ const ulong row = {first} + {r}u; {ep.row_offsets('row')} "
                            f"{value(ig * 4 + r, j, 'w', col)} v{r} = w; }}" for r in range(4))
            store = (f"{{ const ulong row = {first}; {ep.row_offsets('row')} "
                     f"*(__global float4*)(dst + {at('d', col)}) = (float4)(v0, v1, v2, v3); }}")
            body = f"float v0, v1, v2, v3; {rows} {store}"
            cols.append(f"if ({col} < N) {{ {body} }}" if col_check else f"{{ {body} }}")
        guard = f"if ({first} < M) " if row_check else ""
        lines.append(f"{guard}{{\n        " + "\n        ".join(cols) + "\n    }")
    for i in range(tm if not ep.vec_store_rows else 0):
        cols = []
        for jg in range(tn // 4):
            col = f"col0 + {jg * 4 * ln}u"
            if ep.vec_store:
                body = " ".join(value(i, 4 * jg + c, f"v{c}", f"{col} + {c}u") for c in range(4))
                body += f" *(__global float4*)(dst + off_d + ro_d + {col}) = (float4)(v0, v1, v2, v3);"
                cols.append(f"if ({col} < N) {{ {body} }}" if col_check else f"{{ {body} }}")
            else:
                for c in range(4):
                    cc = f"{col} + {c}u"
                    body = value(i, 4 * jg + c, "v", cc) + " " + _dtype_io.store(ep.dst_dtype, "dst", at("d", cc), "v")
                    cols.append(f"if ({cc} < N) {{ {body} }}" if col_check else f"{{ {body} }}")
        guard = "if (row < M) " if row_check else ""
        lines.append(f"{{ const ulong row = row0 + {(i // 4) * 4 * lm + i % 4}u; {guard}{{\n        "
                     + ep.row_offsets("row") + "\n        " + "\n        ".join(cols) + "\n    } }")

    # Warps of 4 x 8 work-items (rows x columns) where the work-group tiles into them.
    if items % 32 == 0 and ln % 8 == 0 and lm % 4 == 0:
        mapping = (f"const uint warp = lid / 32u, lane = lid % 32u;\n"
                   f"    const uint tx = (warp % {ln // 8}u) * 8u + lane % 8u, ty = (warp / {ln // 8}u) * 4u + lane / 8u;")
    else:
        mapping = f"const uint tx = lid % {ln}u, ty = lid / {ln}u;"

    accs = ", ".join(f"c{i}_{j} = 0.0f" for i in range(tm) for j in range(tn))
    regs = ", ".join([f"a_r{g}" for g in range(a.groups)] + [f"b_r{g}" for g in range(b.groups)])
    a_size, b_size = bk * a.stride, bk * b.stride
    main = f"""
    {load("0u", "0u")}
    {a.store("0u")} {b.store("0u")}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint t = 0; t < {slabs}u; ++t) {{
        const uint cur = t & 1u;
        if (t + 1u < {slabs}u) {{
        const uint k0 = (t + 1u) * {bk}u;
        {load("k0", "t + 1u")}
        }}
        const uint ab = cur * {a_size // 4}u + ty, bb = cur * {b_size // 4}u + tx;
        #pragma unroll
        for (uint k = 0; k < {bk}u; ++k) {{
            {step}
        }}
        if (t + 1u < {slabs}u) {{
            const uint nxt = (cur ^ 1u);
            {a.store(f"nxt * {a_size}u")} {b.store(f"nxt * {b_size}u")}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}""" if slabs else ""
    if ks == 1:
        split_head = f"""__local float4 As4[{2 * a_size // 4}];
    __local float4 Bs4[{2 * b_size // 4}];
    __local float* const As = (__local float*)As4;
    __local float* const Bs = (__local float*)Bs4;
    const uint lid = get_local_id(0);"""
        split_sum = ""
    else:
        # Split kg of ks: its own pair of slab buffers and K range [kg * kpart, (kg + 1) * kpart).
        split_head = f"""__local float4 As4_all[{ks * 2 * a_size // 4}];
    __local float4 Bs4_all[{ks * 2 * b_size // 4}];
    const uint kg = get_local_id(0) / {items}u, lid = get_local_id(0) % {items}u;
    __local float4* const As4 = As4_all + kg * {2 * a_size // 4}u;
    __local float4* const Bs4 = Bs4_all + kg * {2 * b_size // 4}u;
    __local float* const As = (__local float*)As4;
    __local float* const Bs = (__local float*)Bs4;"""
        # Splits 1.. leave their sums in A's buffers (the loop ended on a barrier); split 0 adds
        # them in split order and alone runs the epilogue.
        n_acc = tm * tn
        acc_names = [f"c{i}_{j}" for i in range(tm) for j in range(tn)]
        saves = " ".join(f"red[((kg - 1u) * {n_acc}u + {x}u) * {items}u + lid] = {acc};"
                         for x, acc in enumerate(acc_names))
        adds = " ".join(f"{acc} += red[({s * n_acc + x}u) * {items}u + lid];"
                        for s in range(ks - 1) for x, acc in enumerate(acc_names))
        split_sum = f"""__local float* const red = (__local float*)As4_all;
    if (kg > 0u) {{ {saves} }}
    barrier(CLK_LOCAL_MEM_FENCE);
    if (kg > 0u) return;
    {adds}"""
    source = helpers + f"""#define M {m}UL
#define N {n}UL
#define K {k}UL
__kernel __attribute__((reqd_work_group_size({threads}, 1, 1)))
void {name}({params}) {{
    {split_head}
    {mapping}
    const ulong m0 = get_group_id(1) * {bm}UL, n0 = get_group_id(0) * {bn}UL;
    {offsets}
    {a.setup("m0", a_off, items)}
    {b.setup("n0", b_off, items)}
    float4 {regs};
    float {accs};{main}
    {split_sum}
    const ulong row0 = m0 + ty * 4u, col0 = n0 + tx * 4u;
    {(chr(10) + "    ").join(lines)}
}}
"""
    return KernelSpec(
        source=source,
        name=name,
        arg_names=args,
        global_size=(math.ceil(n / bn) * threads, math.ceil(m / bm), nbatch),
        local_size=(threads, 1, 1),
        impl=impl,
    )

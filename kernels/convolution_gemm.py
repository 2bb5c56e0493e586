"""Convolution forward on GPUs as an implicit GEMM: ``matmul_gpu``'s tiled SGEMM, gathering src.

Per group, the convolution is the product of an ``M x K`` matrix by a ``K x N`` one: M runs over
(image, output position), N over the group's output channels, K over (input channel, kernel tap).
No im2col buffer is built: the A operand's loader (``_ImplicitSrc``) decodes each (row, k) into a
src position as it fills the local-memory slab, reading zeros in the padding, and the epilogue
decodes each row into dst's image and position. Everything between (double-buffered slabs,
``TM x TN`` register blocks, float4 reads from local memory) is ``matmul_gpu.gemm_kernel``'s.

K's order follows src's layout: ``tap * ICg + ic`` where channels are src's contiguous axis
(NHWC: four consecutive k are four consecutive channels of one pixel, one float4 load and one
bounds check where ICg is a multiple of 4), ``ic * taps + tap`` otherwise (NCHW: a tap's
neighbours along K are its neighbours in the window). Weights whose layout makes that K order
one stride (OIHW with NCHW, HWIO with NHWC) load as a plain strided matrix (``_Operand``, float4
where aligned); any other layout is gathered element by element (``_ImplicitWeights``).

Why: the direct kernel (``convolution._direct``) computes one output position per work-item for
4 channels and reads src once per 4 outputs; on an H100 it ran ResNet-50 layers at 0.3-0.6x
cuDNN in NCHW and 0.09-0.37x in NHWC (BENCHMARKS.md §13). Tiled, each src value fetched into
local memory serves ``BN`` output channels and each weight ``BM`` positions.

Groups are the batch dimension (``get_group_id(2)``). Depthwise and other convolutions with few
channels per group stay on the direct kernel (``applies``), as do quantized ones.
"""

from __future__ import annotations

import math

from .._values._convolution_desc import ConvolutionDesc
from . import _dtype_io, _post_ops, matmul_gpu
from ._spec import KernelConfig, KernelSpec
from .matmul_gpu import _WIDE, Epilogue, Tile, _Operand

MIN_CHANNELS = 16  # output channels per group the tiles need to stay mostly busy (N of the GEMM)
MIN_ROWS = 64


def applies(desc: ConvolutionDesc, config: KernelConfig) -> bool:
    """GPU shape (vector width 1, work-groups of 64+, local memory for the smallest tile), f32
    math on stored values (no quantization), at least MIN_CHANNELS output channels per group and
    MIN_ROWS output positions in all."""
    if desc.src_quant is not None or desc.weights_quant is not None or desc.dst_quant is not None:
        return False
    smallest = min(matmul_gpu.TILES[name].local_bytes() for name in matmul_gpu.PREFERENCE)
    ocg = desc.weights.dims[0] // desc.groups
    rows = desc.dst.dims[0] * math.prod(desc.dst.dims[2:])
    return (config.vector_width == 1 and config.local_size >= 64 and config.local_memory >= smallest
            and ocg >= MIN_CHANNELS and rows >= MIN_ROWS)


# Tiles by preference: matmul_gpu's order, then its small tiles without a K split (the gathers
# start at k 0).
_CANDIDATES = tuple(dict.fromkeys(matmul_gpu.PREFERENCE + tuple(
    name for name in matmul_gpu.SMALL_PREFERENCE + tuple(matmul_gpu.TILES) if matmul_gpu.TILES[name].ks == 1)))


def choose_tile(m: int, n: int, groups: int, config: KernelConfig) -> Tile:
    """``matmul_gpu.choose_tile``'s rule (the first tile giving MIN_GROUPS work-groups, else the
    one giving the most) over the tiles that waste least of N: a convolution's N is its output
    channels per group, often 24-64, where a 128-wide tile computes half or more for nothing
    (ResNet-50's 64-channel layers took 128x128 tiles at first)."""
    fits = [matmul_gpu.TILES[name] for name in _CANDIDATES
            if matmul_gpu.TILES[name].threads <= config.local_size
            and matmul_gpu.TILES[name].local_bytes() <= config.local_memory]
    waste = {t: math.ceil(n / t.bn) * t.bn / n for t in fits}
    least = min(waste.values())
    tiles = [t for t in fits if waste[t] <= least * 1.1]
    count = lambda t: math.ceil(m / t.bm) * math.ceil(n / t.bn) * groups  # noqa: E731
    for tile in tiles:
        if count(tile) >= matmul_gpu.MIN_GROUPS:
            return tile
    return max(tiles, key=lambda t: (count(t) * t.threads, count(t)))


class _Geometry:
    """The convolution's shapes and strides, and the C code that decodes K and rows."""

    def __init__(self, desc: ConvolutionDesc):
        self.nsp = len(desc.src.dims) - 2
        self.axes = "dhw"[3 - self.nsp:]
        self.ss, self.ws, self.ds = desc.src.strides, desc.weights.strides, desc.dst.strides
        self.isp, self.osp = desc.src.dims[2:], desc.dst.dims[2:]
        self.ksz = desc.weights.dims[2:]
        self.groups = desc.groups
        self.icg = desc.weights.dims[1]
        self.ocg = desc.weights.dims[0] // desc.groups
        self.taps = math.prod(self.ksz)
        self.k = self.icg * self.taps
        self.m = desc.dst.dims[0] * math.prod(self.osp)
        self.strides, self.padding_l, self.dilation = desc.strides, desc.padding_l, desc.dilation
        ss, nsp = self.ss, self.nsp
        dense = all(ss[2 + i] == ss[3 + i] * self.isp[i + 1] for i in range(nsp - 1)) and ss[-1] == 1
        pointwise = (self.taps == 1 and all(s == 1 for s in self.strides) and not any(self.padding_l)
                     and self.isp == self.osp)
        # Four positions as one float4: a 1x1 convolution at stride 1 over dense NCHW planes.
        self.wide_m = (pointwise and dense and math.prod(self.osp) % 4 == 0 and ss[0] % 4 == 0
                       and ss[1] % 4 == 0 and ss[1] != 1)
        # A gathers along M (four positions of one output row, whose taps are neighbours in src)
        # unless channels are src's contiguous axis (NHWC).
        nhwc = ss[1] == 1 and self.icg > 1
        self.along_m = not nhwc and (self.wide_m or self.osp[-1] % 4 == 0)
        # Channels innermost in K for NHWC: a group of four k's is then four channels at one tap,
        # decoded once. (NCHW gathered so, four loads a plane apart, ran ResNet-50's 3x3/2 and 7x7
        # layers at 0.48x and 0.40x cuDNN on an H200, against 0.66x and 0.52x channel-major.)
        self.channels_inner = nhwc

    def k_order(self) -> list[tuple[int, int]]:
        """(weights dim, extent) along K, outermost first."""
        taps = [(2 + i, self.ksz[i]) for i in range(self.nsp)]
        return taps + [(1, self.icg)] if self.channels_inner else [(1, self.icg)] + taps

    def decode_k(self, kk: str, prefix: str) -> str:
        """Statements defining ``{prefix}ic`` and ``{prefix}k<axis>`` from the k index ``kk``."""
        if self.channels_inner:
            lines = [f"const uint {prefix}ic = {kk} % {self.icg}u; uint {prefix}t = {kk} / {self.icg}u;"]
        else:
            lines = [f"const uint {prefix}ic = {kk} / {self.taps}u; uint {prefix}t = {kk} % {self.taps}u;"]
        for i in reversed(range(self.nsp)):
            a = self.axes[i]
            lines.append(f"const uint {prefix}k{a} = {prefix}t % {self.ksz[i]}u; {prefix}t /= {self.ksz[i]}u;")
        return " ".join(lines)

    def decode_row(self, row: str, prefix: str) -> str:
        """Statements defining ``{prefix}n`` (the image) and ``{prefix}o<axis>`` from a row."""
        lines = [f"ulong {prefix}n = {row};"]
        for i in reversed(range(self.nsp)):
            a = self.axes[i]
            lines.append(f"const ulong {prefix}o{a} = {prefix}n % {self.osp[i]}UL; {prefix}n /= {self.osp[i]}UL;")
        return " ".join(lines)

    def weights_k_stride(self) -> int | None:
        """The weights' stride along K where K's order is one stride through them, else None."""
        dims = [(self.ws[d], extent) for d, extent in self.k_order() if extent > 1]
        if not dims:
            return 1
        for (outer, _), (inner, extent) in zip(dims, dims[1:]):
            if outer != inner * extent:
                return None
        return dims[-1][0]


class _ImplicitSrc(_Operand):
    """A's loader: row m of the GEMM is an output position, column k a (channel, tap); the value
    is src at that position's window tap, zero in the padding.

    With channels inner in K (NHWC), groups of 4 run along K: four channels of one tap, decoded
    once, one float4 where aligned. With channels outer (NCHW), where the output rows are a
    multiple of 4, groups run along M: four neighbouring positions of one row at one (channel,
    tap), so a warp's lanes read neighbouring src addresses (a stride apart) and each lane
    decodes k once per group; a 1x1 convolution with stride 1 and no padding reads the four as
    one float4 where aligned. Other NCHW convolutions (rows of 7 or 14) run along K element by
    element. Measured on an H200 (bench_sweep.py --family conv, ÷ cuDNN, NCHW 3x3 layers): four
    positions each decoded before the K loop 0.57-0.74x, along K element by element 0.55-0.76x,
    four positions of a row decoded once 0.84x at stride 1.
    """

    def __init__(self, geo: _Geometry, dtype: str, tile: Tile):
        self.name, self.ptr, self.local, self.dtype, self.geo = "a", "src", "As", dtype, geo
        self.ext, self.k, self.bt, self.bk = geo.m, geo.k, tile.bm, tile.bk
        self.along_k = not geo.along_m
        self.pad = 4 if self.along_k else 0
        self.stride = self.bt + self.pad
        self.groups = tile.bk * self.bt // 4 // tile.items
        ss = geo.ss
        # Along K with channels in fours: each group is one tap (``_shared_tap``).
        self.shared_tap = self.along_k and geo.channels_inner and geo.icg % 4 == 0
        if self.along_k:
            self.wide = (self.shared_tap and ss[1] == 1 and dtype in _WIDE
                         and all(s % 4 == 0 for s in (ss[0],) + tuple(ss[2:])))
        else:
            self.wide = geo.wide_m and dtype in _WIDE

    def setup(self, base: str, off: str, items: int) -> str:
        geo, lines = self.geo, []
        for g in range(self.groups):
            lines.append(self.slab_position(g, items))
            # One position per group decoded: along M the other three follow it in its row
            # (M % 4 == 0 there, so the last group is clamped whole).
            p = f"a{g}_"
            last = self.ext - (1 if self.along_k else 4)
            lines.append(geo.decode_row(f"min({base} + a_mn{g}, {last}UL)", p))
            for i, a in enumerate(geo.axes):
                lines.append(f"const int a_i{a}{g} = (int){p}o{a} * {geo.strides[i]} - {geo.padding_l[i]};")
            if self.wide and not self.along_k:  # the position's whole offset
                terms = [f"{p}o{a} * {geo.ss[2 + i]}UL" for i, a in enumerate(geo.axes)]
                lines.append(f"const ulong a_o{g} = {off} + {p}n * {geo.ss[0]}UL + {' + '.join(terms)};")
            else:
                lines.append(f"const ulong a_o{g} = {off} + {p}n * {geo.ss[0]}UL;")
        return "\n    ".join(lines)

    def _tap(self, g: int, c: int, p: str, tail_k: str | None) -> tuple[str, str]:
        """(in-bounds condition, src offset) of position ``c`` of group ``g`` at the (channel, tap)
        decoded under prefix ``p``; ``tail_k``: the k index where K may run out."""
        geo = self.geo
        conds = [f"{tail_k} < {self.k}u"] if tail_k is not None else []
        offset = [f"a_o{g}", f"{p}ic * {geo.ss[1]}UL"]
        for i, a in enumerate(geo.axes):
            shift = f" + {c * geo.strides[i]}" if c and i == geo.nsp - 1 else ""  # along the row
            at = f"(a_i{a}{g}{shift} + (int){p}k{a} * {geo.dilation[i]})"
            conds.append(f"(uint){at} < {geo.isp[i]}u")
            offset.append(f"(ulong){at} * {geo.ss[2 + i]}UL")
        return " && ".join(conds) or "1", " + ".join(offset)

    def load(self, k0: str, tail: bool) -> str:
        geo, out = self.geo, []
        for g in range(self.groups):
            reg = f"a_r{g}"
            if self.shared_tap:  # the 4 k's are 4 channels of one tap (ICg % 4 == 0)
                kk = f"({k0} + a_k{g})"
                cond, offset = self._tap(g, 0, "q_", kk if tail else None)
                if self.wide:
                    value = _WIDE[self.dtype](self.ptr, "q_o")
                else:  # four loads a channel apart (NCHW)
                    value = "(float4)(" + ", ".join(
                        _dtype_io.load(self.dtype, self.ptr, f"q_o + {c * geo.ss[1]}UL") for c in range(4)) + ")"
                out.append(f"{{ {geo.decode_k(kk, 'q_')} const ulong q_o = {offset}; "
                           f"{reg} = ({cond}) ? {value} : (float4)(0.0f); }}")
            elif self.along_k:
                elems = []
                for c in range(4):
                    kk, p = f"({k0} + a_k{g} + {c}u)", f"q{g}_{c}_"
                    cond, offset = self._tap(g, 0, p, kk if tail else None)
                    out.append(f"{geo.decode_k(kk, p)} const float a_e{g}_{c} = ({cond}) ? "
                               f"{_dtype_io.load(self.dtype, self.ptr, offset)} : 0.0f;")
                    elems.append(f"a_e{g}_{c}")
                out.append(f"{reg} = (float4)({', '.join(elems)});")
            elif self.wide:  # 1x1, stride 1, no padding: four contiguous positions
                kk = f"({k0} + a_k{g})"
                value = _WIDE[self.dtype](self.ptr, f"a_o{g} + (ulong){kk} * {geo.ss[1]}UL")
                if tail:
                    value = f"({kk} < {self.k}u) ? {value} : (float4)(0.0f)"
                out.append(f"{reg} = {value};")
            else:  # four positions at one (channel, tap)
                kk, p = f"({k0} + a_k{g})", f"q{g}_"
                parts = [geo.decode_k(kk, p)]
                elems = []
                for c in range(4):
                    cond, offset = self._tap(g, c, p, kk if tail else None)
                    parts.append(f"const float a_e{g}_{c} = ({cond}) ? "
                                 f"{_dtype_io.load(self.dtype, self.ptr, offset)} : 0.0f;")
                    elems.append(f"a_e{g}_{c}")
                out.append("{ " + " ".join(parts) + f" {reg} = (float4)({', '.join(elems)}); }}")
        return "{ " + " ".join(out) + " }"


class _ImplicitWeights(_Operand):
    """B's loader where K's order is not one stride through the weights: each element's k is
    decoded into (channel, tap), or each group's where it is four channels of one tap. Groups of
    4 run along K."""

    def __init__(self, geo: _Geometry, dtype: str, tile: Tile):
        self.name, self.ptr, self.local, self.dtype, self.geo = "b", "wei", "Bs", dtype, geo
        self.ext, self.k, self.bt, self.bk = geo.ocg, geo.k, tile.bn, tile.bk
        self.along_k, self.pad, self.wide = True, 4, False
        self.stride = self.bt + self.pad
        self.groups = tile.bk * self.bt // 4 // tile.items

    def setup(self, base: str, off: str, items: int) -> str:
        lines = []
        for g in range(self.groups):
            lines.append(self.slab_position(g, items))
            lines.append(f"const ulong b_o{g} = {off} + min({base} + b_mn{g}, {self.ext - 1}UL) * {self.geo.ws[0]}UL;")
        return "\n    ".join(lines)

    def load(self, k0: str, tail: bool) -> str:
        geo, out = self.geo, []
        for g in range(self.groups):
            if geo.channels_inner and geo.icg % 4 == 0:  # four channels at one tap: decoded once
                kk, p = f"({k0} + b_k{g})", f"w{g}_"
                offset = " + ".join([f"b_o{g}", f"{p}ic * {geo.ws[1]}UL"]
                                    + [f"{p}k{a} * {geo.ws[2 + i]}UL" for i, a in enumerate(geo.axes)])
                value = "(float4)(" + ", ".join(
                    _dtype_io.load(self.dtype, self.ptr, f"{p}o + {c * geo.ws[1]}UL") for c in range(4)) + ")"
                if tail:
                    value = f"({kk} < {self.k}u) ? {value} : (float4)(0.0f)"
                out.append(f"{{ {geo.decode_k(kk, p)} const ulong {p}o = {offset}; b_r{g} = {value}; }}")
                continue
            elems = []
            for c in range(4):
                kk, p = f"({k0} + b_k{g} + {c}u)", f"w{g}_{c}_"
                offset = " + ".join([f"b_o{g}", f"{p}ic * {geo.ws[1]}UL"]
                                    + [f"{p}k{a} * {geo.ws[2 + i]}UL" for i, a in enumerate(geo.axes)])
                value = _dtype_io.load(self.dtype, self.ptr, offset)
                if tail:
                    value = f"({kk} < {self.k}u ? {value} : 0.0f)"
                out.append(f"{geo.decode_k(kk, p)} const float b_e{g}_{c} = {value};")
                elems.append(f"b_e{g}_{c}")
            out.append(f"b_r{g} = (float4)({', '.join(elems)});")
        return "{ " + " ".join(out) + " }"


def implicit_gemm(desc: ConvolutionDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    """The kernel of ``desc`` with the chain ``post_ops`` (the output scale leading, as
    ``_post_ops.generate_scaled`` hands it); ``applies`` said yes."""
    geo = _Geometry(desc)
    src_dtype, wei_dtype, dst_dtype = desc.src.dtype, desc.weights.dtype, desc.dst.dtype
    has_bias = desc.bias is not None
    ocg, ds = geo.ocg, geo.ds
    tile = choose_tile(geo.m, ocg, geo.groups, config)
    po_strides = _post_ops.operand_strides(post_ops, len(desc.dst.dims))

    a = _ImplicitSrc(geo, src_dtype, tile)
    k_stride = geo.weights_k_stride()
    if k_stride is None:
        b: _Operand = _ImplicitWeights(geo, wei_dtype, tile)
    else:
        b = _Operand("b", "wei", "Bs", wei_dtype, ocg, geo.k, geo.ws[0], k_stride,
                     (ocg * geo.ws[0],) if geo.groups > 1 else (), tile.bn, tile)

    # Per group (the batch dimension): where its channels start in every tensor.
    channel_strides = {"a": geo.icg * geo.ss[1], "b": ocg * geo.ws[0], "d": ocg * ds[1]}
    col_strides = {"d": ds[1]}
    row_strides = {"d": ds}
    if desc.bias is not None:
        channel_strides["c"] = ocg * desc.bias.strides[0]
        col_strides["c"] = desc.bias.strides[0]
    for name, s in po_strides.items():
        channel_strides[name] = ocg * s[1]
        col_strides[name] = s[1]
        row_strides[name] = s
    offsets = " ".join(f"const ulong off_{t} = (ulong)get_group_id(2) * {s}UL;" for t, s in channel_strides.items())

    def row_offsets(row: str) -> str:
        lines = [geo.decode_row(row, "e_")]
        for t, s in row_strides.items():
            terms = [f"e_n * {s[0]}UL"] + [f"e_o{a} * {s[2 + i]}UL" for i, a in enumerate(geo.axes) if s[2 + i]]
            lines.append(f"const ulong ro_{t} = {' + '.join(terms)};")
        if has_bias:
            lines.append("const ulong ro_c = 0;")
        return " ".join(lines)

    epilogue = Epilogue(
        dst_dtype=dst_dtype, bias_dtype=None if desc.bias is None else desc.bias.dtype, post_ops=post_ops,
        col_strides=col_strides, row_offsets=row_offsets,
        vec_store=(dst_dtype == "f32" and ds[1] == 1 and ocg % 4 == 0
                   and all(s % 4 == 0 for s in (ds[0],) + tuple(ds[2:]))),
        # NCHW dst: four positions of a channel as one float4 (the column stores above write a
        # warp's 32 values into 32 sectors).
        vec_store_rows=(dst_dtype == "f32" and ds[-1] == 1 and math.prod(geo.osp) % 4 == 0
                        and all(ds[2 + i] == ds[3 + i] * geo.osp[i + 1] for i in range(geo.nsp - 1))
                        and ds[0] % 4 == 0 and ds[1] % 4 == 0 and ds[1] != 1),
    )
    order = "kc" if geo.channels_inner else "ck"
    return matmul_gpu.gemm_kernel(
        name="convolution_fwd", m=geo.m, n=ocg, k=geo.k, tile=tile, a=a, b=b, offsets=offsets, a_off="off_a",
        b_off="off_b", epilogue=epilogue, nbatch=geo.groups, impl=f"ocl:implicit_gemm:{order}:{tile.name}",
    )

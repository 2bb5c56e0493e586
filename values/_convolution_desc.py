"""The convolution (forward) operation descriptor, and the output-size rule it validates against."""

from __future__ import annotations

import operator

import attrs
import numpy as np

from . import _post_ops
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind
from ._quantization import Quantization


def out_size(in_size: int, kernel: int, stride: int, pad_l: int, pad_r: int, dilation: int) -> int:
    """``(in + pl + pr - ((k - 1) * dil + 1)) // s + 1``; may be < 1 when the kernel does not fit."""
    return (in_size + pad_l + pad_r - ((kernel - 1) * dilation + 1)) // stride + 1


def _int(name: str, value) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} {value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} {value!r} must be an integer or a sequence of integers") from None


def _per_axis(name: str, value, nsp: int, default: int, minimum: int) -> tuple[int, ...]:
    """``value`` as one integer per spatial axis: None (``default``), an int, or a sequence."""
    if value is None:
        return (default,) * nsp
    if isinstance(value, (list, tuple)):
        values = tuple(_int(name, v) for v in value)
        if len(values) != nsp:
            raise InvalidArgumentError(
                f"{name} {tuple(value)!r} has {len(values)} entries; src has {nsp} spatial dimensions"
            )
    else:
        values = (_int(name, value),) * nsp
    if any(v < minimum for v in values):
        raise InvalidArgumentError(f"{name} {values!r} must all be >= {minimum}")
    return values


def check_spatial(desc, weights_layout: str) -> tuple[int, int, tuple[int, ...]]:
    """The checks convolution and deconvolution share: src of 1 to 3 spatial dims, weights of
    src's rank (``weights_layout`` names their leading dims in the error), ``groups`` >= 1.
    Returns the number of spatial dims, and ``groups`` and ``strides`` normalised for the
    descriptor to set."""
    check_memory_desc("src", desc.src)
    check_memory_desc("weights", desc.weights)
    if not 3 <= desc.src.ndims <= 5:
        raise InvalidArgumentError(
            f"src dims {desc.src.dims} must be (N, C, W), (N, C, H, W) or (N, C, D, H, W)"
        )
    nsp = desc.src.ndims - 2
    if desc.weights.ndims != desc.src.ndims:
        raise ArgumentMismatchError(
            f"weights dims {desc.weights.dims} must be ({weights_layout}, {nsp} kernel sizes) "
            f"for src dims {desc.src.dims}"
        )
    groups = _int("groups", desc.groups)
    if groups < 1:
        raise InvalidArgumentError(f"groups {groups} must be >= 1")
    return nsp, groups, _per_axis("strides", desc.strides, nsp, 1, 1)


def _layout_like(dims: tuple[int, ...], like: MemoryDesc) -> MemoryDesc:
    """Dense ``dims`` with the axis order of ``like`` (nhwc src -> nhwc dst)."""
    order = sorted(range(len(dims)), key=lambda axis: (-like.strides[axis], axis))
    strides = [0] * len(dims)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= dims[axis]
    return MemoryDesc(dims, like.dtype, tuple(strides))


def output_spatial(weights_name: str, src: tuple[int, ...], weights: tuple[int, ...], strides, padding_l,
                   padding_r, dilation) -> tuple[int, ...]:
    """The convolution's output size on each spatial axis, refusing a kernel larger than the
    padded src (``weights_name``: the weights' role, as the error names it)."""
    out = []
    for i in range(len(src) - 2):
        size, k = src[2 + i], weights[2 + i]
        pl, pr, dil = padding_l[i], padding_r[i], dilation[i]
        o = out_size(size, k, strides[i], pl, pr, dil)
        if o < 1:
            raise ArgumentMismatchError(
                f"{weights_name} kernel size {k} (dilated extent {(k - 1) * dil + 1}) on spatial axis {i} "
                f"is larger than the padded src size {size} + {pl} + {pr}"
            )
        out.append(o)
    return tuple(out)


@op_kind
@attrs.frozen(cache_hash=True)
class ConvolutionDesc(OpDesc):
    """Forward convolution, 1D/2D/3D (oneDNN's ``convolution_forward``, direct algorithm).

    * ``src``: (N, C, spatial...) — (N, C, W), (N, C, H, W) or (N, C, D, H, W), any strides, so
      NCHW and NHWC (``MemoryDesc(dims, "f32", "nhwc")``) are both just layouts.
    * ``weights``: (OC, C / groups, k...), any strides. This is the plain (ungrouped) form: the
      groups come from the ``groups`` field, not from a leading G dimension as in oneDNN's
      ``goihw``; depthwise is ``groups == C`` with weights (C, 1, k...).
    * ``bias``: optional, (OC,).
    * ``dst``: (N, OC, out...) with ``out = (in + pl + pr - ((k - 1) * dil + 1)) // s + 1``;
      defaults to the dense layout with src's axis order (nhwc src -> nhwc dst).
    * ``strides``, ``padding_l``, ``padding_r``, ``dilation``: an int (every spatial axis) or one
      per spatial axis. Defaults: strides 1, padding 0, ``padding_r`` = ``padding_l``,
      dilation 1. **Dilation is a plain factor, 1 = none** (taps ``dil`` apart); oneDNN counts
      the gap instead, ``0`` = none, so oneDNN's ``d`` is ``d + 1`` here.
    * ``output_scale`` (keyword, finite, default 1): oneDNN v2's output scale, multiplying the
      result (bias included) before the post-ops.
    * ``post_ops`` (keyword): a chain of ``("eltwise", alg, alpha, beta)``, ``("sum", scale)`` and
      ``("binary", alg, src1)`` applied before the store (the forms docs/primitives.md lists under "Post-op chains"); a
      binary operand broadcasts to dst, e.g. ``(1, OC, 1, 1)`` per channel, and is the argument
      ``post_op_{i}_src1``.

    * Data types: ``src``, ``weights``, ``bias`` and ``dst`` may each have any data type (f32
      math, any storage, e.g. bf16 src and weights with an f32 or bf16 dst); the default dst
      takes src's. Binary post-op operands are f32.
    * ``src_quant``, ``weights_quant``, ``dst_quant`` (keyword, ``Quantization``, static per
      tensor; oneDNN Graph's fused int8 convolution): src and weights are their stored values
      (s8/u8/f8) less their zero points, their products summed exactly in f32 (below 2^24) and
      the sum multiplied once by the two scales before bias, output scale and post-ops; dst is
      stored quantized (``round(y / scale + zp)``, saturated). A sum post-op cannot read a
      quantized dst.

    The resolved per-axis tuples are stored, so an int and its spelled-out tuple make one
    descriptor (and one cache entry).
    """

    src: MemoryDesc
    weights: MemoryDesc
    dst: MemoryDesc = attrs.field(default=None)
    bias: MemoryDesc | None = None
    strides: tuple[int, ...] = attrs.field(default=None)
    padding_l: tuple[int, ...] = attrs.field(default=None)
    padding_r: tuple[int, ...] = attrs.field(default=None)
    dilation: tuple[int, ...] = attrs.field(default=None)
    groups: int = 1
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)
    output_scale: float = _post_ops.output_scale_field()
    src_quant: Quantization | None = attrs.field(default=None, kw_only=True)
    weights_quant: Quantization | None = attrs.field(default=None, kw_only=True)
    dst_quant: Quantization | None = attrs.field(default=None, kw_only=True)

    kind = "convolution"
    ARGS = (Arg("src"), Arg("weights"), Arg("bias", optional=True), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        nsp, groups, strides = check_spatial(self, "OC, C/groups")
        self._set("groups", groups)
        self._set("strides", strides)
        if self.dilation is not None and 0 in (
            self.dilation if isinstance(self.dilation, (list, tuple)) else (self.dilation,)
        ):
            raise InvalidArgumentError(
                f"dilation {self.dilation!r} must be >= 1: it is a plain factor here, 1 = none "
                "(oneDNN's 0 = none is 1 here)"
            )
        self._set("dilation", _per_axis("dilation", self.dilation, nsp, 1, 1))
        self._set("padding_l", _per_axis("padding_l", self.padding_l, nsp, 0, 0))
        padding_r = self.padding_l if self.padding_r is None else self.padding_r
        self._set("padding_r", _per_axis("padding_r", padding_r, nsp, 0, 0))

        n, c = self.src.dims[:2]
        oc, icg = self.weights.dims[:2]
        if c % groups:
            raise ArgumentMismatchError(f"src channels {c} (dims {self.src.dims}) are not divisible by groups {groups}")
        if oc % groups:
            raise ArgumentMismatchError(
                f"weights output channels {oc} (dims {self.weights.dims}) are not divisible by groups {groups}"
            )
        if icg != c // groups:
            raise ArgumentMismatchError(
                f"weights dims {self.weights.dims} have {icg} input channels per group; src has "
                f"{c} channels in {groups} groups, so {c // groups} are expected"
            )
        dims = (n, oc) + output_spatial("weights", self.src.dims, self.weights.dims, self.strides,
                                        self.padding_l, self.padding_r, self.dilation)
        if self.dst is None:
            self._set("dst", _layout_like(dims, self.src))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from the convolution's output dims {dims}")
        if self.bias is not None:
            check_memory_desc("bias", self.bias)
            if self.bias.dims != (oc,):
                raise ArgumentMismatchError(f"bias dims {self.bias.dims} must be ({oc},), one per output channel")
        self._set("post_ops", _post_ops.check(self.post_ops, dims))
        self._check_quantization()

    def _check_quantization(self) -> None:
        for name in ("src", "weights", "dst"):
            quant = getattr(self, f"{name}_quant")
            if quant is None:
                continue
            if not isinstance(quant, Quantization):
                raise InvalidArgumentError(f"{name}_quant must be a Quantization or None, not {type(quant).__name__}")
            md = getattr(self, name)
            if quant.dtype != md.dtype:
                raise ArgumentMismatchError(f"{name} has dtype {md.dtype!r} but {name}_quant is for {quant.dtype!r}")
            if quant.grouped:
                raise InvalidArgumentError(f"{name}_quant must be static (per tensor); it has a group {quant.group}")
        if self.dst_quant is not None and any(entry[0] == "sum" for entry in self.post_ops):
            raise InvalidArgumentError("a sum post-op cannot read a quantized dst (dst_quant)")

    @property
    def quant_scale(self) -> float:
        """The f32 product of the src and weights scales the kernel multiplies the sum by."""
        scale = np.float32(1.0)
        for quant in (self.src_quant, self.weights_quant):
            if quant is not None:
                scale = np.float32(scale * np.float32(quant.static_scale))
        return float(scale)

    @property
    def label(self) -> str:
        # Dimensionality and groups tell convolutions apart in verbose lines and traces.
        return f"convolution {self.src.ndims - 2}d" + (f" g{self.groups}" if self.groups > 1 else "")

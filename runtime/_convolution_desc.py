"""The convolution (forward) operation descriptor."""

from __future__ import annotations

import operator

import attrs

from ._values._errors import ArgumentMismatchError, InvalidArgumentError
from ._values._memory_desc import MemoryDesc
from ._primitive_desc import AnyStorage
from . import _post_op_chain
from .kernels import _post_ops as post_op_kernels
from .kernels import KernelConfig, KernelSpec
from .kernels import convolution as convolution_kernels


def _check_memory_desc(name: str, value) -> None:
    if not isinstance(value, MemoryDesc):
        raise InvalidArgumentError(f"{name} is {type(value).__name__}, expected triodnn.MemoryDesc")


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


def _layout_like(dims: tuple[int, ...], like: MemoryDesc) -> MemoryDesc:
    """Dense ``dims`` with the axis order of ``like`` (nhwc src -> nhwc dst)."""
    order = sorted(range(len(dims)), key=lambda axis: (-like.strides[axis], axis))
    strides = [0] * len(dims)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= dims[axis]
    return MemoryDesc(dims, like.dtype, tuple(strides))


@attrs.frozen(cache_hash=True)
class ConvolutionDesc(AnyStorage):
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
      ``("binary", alg, src1)`` applied before the store (see ``triodnn._post_op_chain``); a binary
      operand broadcasts to dst, e.g. ``(1, OC, 1, 1)`` per channel, and is the argument
      ``post_op_{i}_src1``.

    * Data types: ``src``, ``weights``, ``bias`` and ``dst`` may each have any data type
      (``AnyStorage``; f32 math, e.g. bf16 src and weights with an f32 or bf16 dst); the default
      dst takes src's. Binary post-op operands are f32.

    The resolved per-axis tuples are stored, so an int and its spelled-out tuple make one
    descriptor (and one cache entry).
    """

    src: MemoryDesc
    weights: MemoryDesc
    dst: MemoryDesc = None
    bias: MemoryDesc | None = None
    strides: tuple[int, ...] = None
    padding_l: tuple[int, ...] = None
    padding_r: tuple[int, ...] = None
    dilation: tuple[int, ...] = None
    groups: int = 1
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_op_chain.eq_key)
    output_scale: float = _post_op_chain.output_scale_field()

    kind = "convolution"

    def __attrs_post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        _check_memory_desc("src", self.src)
        _check_memory_desc("weights", self.weights)
        if not 3 <= self.src.ndims <= 5:
            raise InvalidArgumentError(
                f"src dims {self.src.dims} must be (N, C, W), (N, C, H, W) or (N, C, D, H, W)"
            )
        nsp = self.src.ndims - 2
        if self.weights.ndims != self.src.ndims:
            raise ArgumentMismatchError(
                f"weights dims {self.weights.dims} must be (OC, C/groups, {nsp} kernel sizes) "
                f"for src dims {self.src.dims}"
            )
        groups = _int("groups", self.groups)
        if groups < 1:
            raise InvalidArgumentError(f"groups {groups} must be >= 1")
        set_("groups", groups)
        set_("strides", _per_axis("strides", self.strides, nsp, 1, 1))
        if self.dilation is not None and 0 in (
            self.dilation if isinstance(self.dilation, (list, tuple)) else (self.dilation,)
        ):
            raise InvalidArgumentError(
                f"dilation {self.dilation!r} must be >= 1: it is a plain factor here, 1 = none "
                "(oneDNN's 0 = none is 1 here)"
            )
        set_("dilation", _per_axis("dilation", self.dilation, nsp, 1, 1))
        set_("padding_l", _per_axis("padding_l", self.padding_l, nsp, 0, 0))
        padding_r = self.padding_l if self.padding_r is None else self.padding_r
        set_("padding_r", _per_axis("padding_r", padding_r, nsp, 0, 0))

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
        out = []
        for i in range(nsp):
            size, k = self.src.dims[2 + i], self.weights.dims[2 + i]
            pl, pr, dil = self.padding_l[i], self.padding_r[i], self.dilation[i]
            o = convolution_kernels.out_size(size, k, self.strides[i], pl, pr, dil)
            if o < 1:
                raise ArgumentMismatchError(
                    f"weights kernel size {k} (dilated extent {(k - 1) * dil + 1}) on spatial axis {i} "
                    f"is larger than the padded src size {size} + {pl} + {pr}"
                )
            out.append(o)
        dims = (n, oc) + tuple(out)
        if self.dst is None:
            set_("dst", _layout_like(dims, self.src))
        _check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from the convolution's output dims {dims}")
        if self.bias is not None:
            _check_memory_desc("bias", self.bias)
            if self.bias.dims != (oc,):
                raise ArgumentMismatchError(f"bias dims {self.bias.dims} must be ({oc},), one per output channel")
        set_("post_ops", _post_op_chain.check(self.post_ops, dims))

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        descs = {"src": self.src, "weights": self.weights}
        if self.bias is not None:
            descs["bias"] = self.bias
        descs.update(post_op_kernels.operands(self.post_ops))
        descs["dst"] = self.dst
        return descs

    @property
    def label(self) -> str:
        return f"convolution {self.src.ndims - 2}d" + (f" g{self.groups}" if self.groups > 1 else "")


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return _post_op_chain.generate_scaled(
            lambda chain: convolution_kernels.generate(
                src_dims=self.src.dims,
                src_strides=self.src.strides,
                wei_dims=self.weights.dims,
                wei_strides=self.weights.strides,
                dst_dims=self.dst.dims,
                dst_strides=self.dst.strides,
                bias_strides=None if self.bias is None else self.bias.strides,
                strides=self.strides,
                padding_l=self.padding_l,
                dilation=self.dilation,
                groups=self.groups,
                config=config,
                post_ops=chain,
                src_dtype=self.src.dtype,
                wei_dtype=self.weights.dtype,
                bias_dtype="f32" if self.bias is None else self.bias.dtype,
                dst_dtype=self.dst.dtype,
            ),
            self.post_ops,
            self.output_scale,
        )

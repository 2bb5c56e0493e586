"""Operation descriptors for pooling and the normalizations (layer, RMS, batch inference, group).

Same pattern as the other kinds: frozen, hashable values; ``arg_descs`` in kernel-argument order;
errors name the offending argument and share ``_primitive_desc``'s checks. Optional arguments
(``scale``, ``shift``, layer normalization's ``mean``/``variance`` outputs) are None when absent and
then are not kernel arguments at all. Kernel argument order, of those present:
src, scale, shift, mean, variance, the post-op operands ``post_op_{i}_src1``, dst.

The normalizations take oneDNN's attributes as keywords: ``output_scale`` (finite, default 1;
oneDNN v2's output scale, multiplying the normalised output before the post-ops) and
``post_ops``, a chain of ``("eltwise", alg, alpha, beta)``, ``("sum", scale)`` and
``("binary", alg, src1)`` applied to dst's values before the store (see
``triodnn._post_op_chain``); a binary operand broadcasts to dst.

Data types: ``src`` and ``dst`` of every kind here may each have any data type (``AnyStorage``, f32
math); the normalizations' ``scale``, ``shift``, ``mean`` and ``variance`` are f32 only, as
oneDNN's, and so are binary post-op operands.
"""

from __future__ import annotations

import operator

import attrs

from ._values._errors import ArgumentMismatchError, InvalidArgumentError, UnsupportedError
from ._values._memory_desc import MemoryDesc
from ._primitive_desc import AnyStorage, _finite_float, _float_key, _memory_desc
from ._reduction_desc import _to_axis
from . import _post_op_chain
from .kernels import _post_ops as post_op_kernels
from .kernels import KernelConfig, KernelSpec
from .kernels import normalization as norm_kernels
from .kernels import pooling as pooling_kernels


def _int_tuple(name: str):
    """Converter: an int or a sequence of ints (no bools, no floats) to a tuple; None passes."""

    def convert(value):
        if value is None:
            return None
        items = (value,) if isinstance(value, int) or not hasattr(value, "__iter__") else value
        if isinstance(items, (str, bytes)):
            raise InvalidArgumentError(f"{name} {value!r} is not a sequence of integers")
        out = []
        for v in items:
            if isinstance(v, bool):
                raise InvalidArgumentError(f"{name} {value!r} must hold integers")
            try:
                out.append(operator.index(v))
            except TypeError:
                raise InvalidArgumentError(f"{name} {value!r} must hold integers") from None
        return tuple(out)

    return convert


def _optional_md(name: str):
    def validate(instance, attribute, value) -> None:
        if value is not None:
            _memory_desc(name)(instance, attribute, value)

    return validate


def _epsilon(value) -> float:
    eps = _finite_float("epsilon")(value)
    if eps < 0.0:
        raise InvalidArgumentError(f"epsilon {value!r} must be non-negative")
    return eps


def _present(**descs) -> dict[str, MemoryDesc]:
    return {name: md for name, md in descs.items() if md is not None}


def _check_channel_param(name: str, md: MemoryDesc | None, length: int, what: str) -> None:
    if md is not None and md.dims != (length,):
        raise ArgumentMismatchError(f"{name} dims {md.dims} must be ({length},), one value per {what}")


def _resolve_dst_and_post_ops(instance, src: MemoryDesc) -> None:
    """dst defaulted to src and checked, then the post-op chain checked against it."""
    if instance.dst is None:
        object.__setattr__(instance, "dst", src)
    _memory_desc("dst")(instance, None, instance.dst)
    if instance.dst.dims != src.dims:
        raise ArgumentMismatchError(f"dst dims {instance.dst.dims} differ from src dims {src.dims}")
    object.__setattr__(instance, "post_ops", _post_op_chain.check(instance.post_ops, instance.dst.dims))


def _post_ops_field():
    return attrs.field(default=(), kw_only=True, eq=_post_op_chain.eq_key)


def _with_operands(inputs: dict[str, MemoryDesc], post_ops: tuple, dst: MemoryDesc) -> dict[str, MemoryDesc]:
    """``arg_descs`` in kernel order: the inputs and outputs present, the post-op operands, dst."""
    return {**inputs, **post_op_kernels.operands(post_ops), "dst": dst}


# The normalizations' parameters and statistics: f32 only, whatever src and dst hold.
_F32_PARAMETERS = ("scale", "shift", "mean", "variance")


class _NormStorage(AnyStorage):
    """``AnyStorage`` for src and dst; scale, shift, mean and variance f32 only (oneDNN's rule)."""

    __slots__ = ()

    def check_supported(self) -> None:
        super().check_supported()
        for name in _F32_PARAMETERS:
            desc = self.arg_descs.get(name)
            if desc is not None and desc.dtype != "f32":
                raise UnsupportedError(
                    f"{self.kind}: {name} has dtype {desc.dtype!r}; scale, shift, mean and variance "
                    "are f32 only (src and dst take any data type)"
                )


@attrs.frozen(cache_hash=True)
class PoolingDesc(AnyStorage):
    """``dst = pool(src)``, oneDNN's pooling forward, on ``(N, C, spatial...)`` dims, 1-3 spatial.

    ``alg``: ``max``, ``avg_include_padding`` or ``avg_exclude_padding``. ``kernel``, ``strides``,
    ``padding_l`` take one value per spatial dimension (an int means the same for each);
    ``padding_r`` defaults to ``padding_l``; ``dilation`` is the plain factor, default 1 (oneDNN
    counts from 0: its ``d`` is ``d + 1`` here). Any strides for src and dst (NXC via strides).
    ``dst`` defaults to the dense tensor of the computed dims
    ``out = (in + pl + pr - ((k - 1) * dil + 1)) // s + 1``; when given, its dims must match.
    ``src`` and ``dst`` may each have any data type (f32 math); dst defaults to src's.
    """

    alg: str = attrs.field()
    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    kernel: tuple[int, ...] = attrs.field(converter=_int_tuple("kernel"), kw_only=True)
    strides: tuple[int, ...] = attrs.field(converter=_int_tuple("strides"), kw_only=True)
    padding_l: tuple[int, ...] = attrs.field(converter=_int_tuple("padding_l"), kw_only=True)
    padding_r: tuple[int, ...] = attrs.field(default=None, converter=_int_tuple("padding_r"), kw_only=True)
    dilation: tuple[int, ...] = attrs.field(default=None, converter=_int_tuple("dilation"), kw_only=True)

    kind = "pooling"

    @alg.validator
    def _check_alg(self, attribute, value) -> None:
        if value not in pooling_kernels.ALGORITHMS:
            raise InvalidArgumentError(
                f"alg {value!r} is not a pooling algorithm; known: {', '.join(pooling_kernels.ALGORITHMS)}"
            )

    def __attrs_post_init__(self) -> None:
        src = self.src
        nsp = src.ndims - 2
        if not 1 <= nsp <= 3:
            raise InvalidArgumentError(
                f"src dims {src.dims} must be (N, C, spatial...) with 1 to 3 spatial dimensions"
            )
        if self.padding_r is None:
            object.__setattr__(self, "padding_r", self.padding_l)
        if self.dilation is None:
            object.__setattr__(self, "dilation", (1,) * nsp)
        for name in ("kernel", "strides", "padding_l", "padding_r", "dilation"):
            value = getattr(self, name)
            if len(value) == 1 and nsp > 1:
                value = value * nsp
                object.__setattr__(self, name, value)
            if len(value) != nsp:
                raise InvalidArgumentError(
                    f"{name} {value} has {len(value)} values; src {src.dims} has {nsp} spatial dimensions"
                )
        for name, low in (("kernel", 1), ("strides", 1), ("padding_l", 0), ("padding_r", 0), ("dilation", 1)):
            value = getattr(self, name)
            if any(v < low for v in value):
                raise InvalidArgumentError(f"{name} {value} must be >= {low} in every dimension")
        out = []
        for k in range(nsp):
            i_len = src.dims[2 + k]
            o = pooling_kernels.output_extent(
                i_len, self.kernel[k], self.strides[k], self.padding_l[k], self.padding_r[k], self.dilation[k]
            )
            if o < 1:
                raise InvalidArgumentError(
                    f"kernel {self.kernel} (dilation {self.dilation}) with padding_l {self.padding_l} "
                    f"and padding_r {self.padding_r} does not fit src {src.dims}: spatial dimension {k} "
                    f"would have {o} outputs"
                )
            empty = pooling_kernels.empty_window(
                i_len, o, self.kernel[k], self.strides[k], self.padding_l[k], self.dilation[k]
            )
            if empty is not None:
                raise InvalidArgumentError(
                    f"padding_l {self.padding_l} / padding_r {self.padding_r} with kernel {self.kernel}, "
                    f"strides {self.strides}, dilation {self.dilation}: the window of output {empty} in "
                    f"spatial dimension {k} lies entirely in padding"
                )
            out.append(o)
        dims = src.dims[:2] + tuple(out)
        if self.dst is None:
            object.__setattr__(self, "dst", MemoryDesc(dims, src.dtype))
        _memory_desc("dst")(self, None, self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from the pooled dims {dims}")

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": self.src, "dst": self.dst}

    @property
    def label(self) -> str:
        return f"pooling:{self.alg}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return pooling_kernels.generate(
            self.alg,
            src_dims=self.src.dims,
            src_strides=self.src.strides,
            dst_dims=self.dst.dims,
            dst_strides=self.dst.strides,
            kernel=self.kernel,
            strides=self.strides,
            padding_l=self.padding_l,
            dilation=self.dilation,
            config=config,
            src_dtype=self.src.dtype,
            dst_dtype=self.dst.dtype,
        )


@attrs.frozen(cache_hash=True)
class LayerNormDesc(_NormStorage):
    """oneDNN's layer normalization forward (inference), over ``axis`` (default the last).

    ``y = (x - mean) / sqrt(var + epsilon) * scale + shift``; ``scale`` and ``shift`` (dims
    ``(C,)``, C the normalised extent) are optional separate arguments; ``mean`` and ``variance``
    (dims = src dims without ``axis``) are optional outputs written when given. ``dst``
    defaults to ``src`` (same descriptor: in place is then safe). src needs 2 or more dims.
    """

    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    axis: int = attrs.field(default=-1, converter=_to_axis)
    epsilon: float = attrs.field(default=1e-5, converter=_epsilon, eq=_float_key)
    scale: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("scale"))
    shift: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("shift"))
    mean: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("mean"))
    variance: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("variance"))
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_op_chain.output_scale_field()

    kind = "layer_normalization"

    def __attrs_post_init__(self) -> None:
        ndims = self.src.ndims
        if ndims < 2:
            raise InvalidArgumentError(f"src dims {self.src.dims} must have 2 or more dimensions")
        if not -ndims <= self.axis < ndims:
            raise InvalidArgumentError(f"axis {self.axis} is out of range for src of {ndims} dimensions {self.src.dims}")
        axis = self.axis % ndims
        object.__setattr__(self, "axis", axis)
        _resolve_dst_and_post_ops(self, self.src)
        c = self.src.dims[axis]
        _check_channel_param("scale", self.scale, c, "normalised element")
        _check_channel_param("shift", self.shift, c, "normalised element")
        stat_dims = self.src.dims[:axis] + self.src.dims[axis + 1:]
        for name in ("mean", "variance"):
            md = getattr(self, name)
            if md is not None and md.dims != stat_dims:
                raise ArgumentMismatchError(f"{name} dims {md.dims} must be {stat_dims} (src dims without axis {axis})")

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return _with_operands(
            _present(src=self.src, scale=self.scale, shift=self.shift, mean=self.mean, variance=self.variance),
            self.post_ops, self.dst,
        )

    @property
    def label(self) -> str:
        return "layer_normalization"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return _post_op_chain.generate_scaled(
            lambda chain: norm_kernels.generate_layer(
                dims=self.src.dims,
                src_strides=self.src.strides,
                dst_strides=self.dst.strides,
                axis=self.axis,
                epsilon=self.epsilon,
                scale_stride=None if self.scale is None else self.scale.strides[0],
                shift_stride=None if self.shift is None else self.shift.strides[0],
                mean_strides=None if self.mean is None else self.mean.strides,
                variance_strides=None if self.variance is None else self.variance.strides,
                config=config,
                post_ops=chain,
                src_dtype=self.src.dtype,
                dst_dtype=self.dst.dtype,
            ),
            self.post_ops,
            self.output_scale,
        )


@attrs.frozen(cache_hash=True)
class RMSNormDesc(_NormStorage):
    """RMS normalization over the last dim: ``y = x / sqrt(mean(x^2) + epsilon) * scale``.

    oneDNN's layer normalization with the ``rms_norm`` flag. ``scale`` (dims ``(C,)``) optional;
    ``dst`` defaults to ``src``. src needs 2 or more dims.
    """

    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    epsilon: float = attrs.field(default=1e-5, converter=_epsilon, eq=_float_key)
    scale: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("scale"))
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_op_chain.output_scale_field()

    kind = "rms_normalization"

    def __attrs_post_init__(self) -> None:
        if self.src.ndims < 2:
            raise InvalidArgumentError(f"src dims {self.src.dims} must have 2 or more dimensions")
        _resolve_dst_and_post_ops(self, self.src)
        _check_channel_param("scale", self.scale, self.src.dims[-1], "normalised element")

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return _with_operands(_present(src=self.src, scale=self.scale), self.post_ops, self.dst)

    @property
    def label(self) -> str:
        return "rms_normalization"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return _post_op_chain.generate_scaled(
            lambda chain: norm_kernels.generate_layer(
                dims=self.src.dims,
                src_strides=self.src.strides,
                dst_strides=self.dst.strides,
                axis=self.src.ndims - 1,
                epsilon=self.epsilon,
                scale_stride=None if self.scale is None else self.scale.strides[0],
                shift_stride=None,
                mean_strides=None,
                variance_strides=None,
                rms=True,
                config=config,
                post_ops=chain,
                src_dtype=self.src.dtype,
                dst_dtype=self.dst.dtype,
            ),
            self.post_ops,
            self.output_scale,
        )


@attrs.frozen(cache_hash=True)
class BatchNormInferenceDesc(_NormStorage):
    """oneDNN's batch normalization forward inference with global statistics, channel = dim 1.

    ``y = scale / sqrt(variance + epsilon) * (x - mean) + shift``; ``mean``, ``variance``,
    ``scale``, ``shift`` have dims ``(C,)`` (the last two optional). ``dst`` defaults to ``src``.
    """

    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    mean: MemoryDesc = attrs.field(validator=_memory_desc("mean"))
    variance: MemoryDesc = attrs.field(validator=_memory_desc("variance"))
    dst: MemoryDesc = attrs.field(default=None)
    epsilon: float = attrs.field(default=1e-5, converter=_epsilon, eq=_float_key)
    scale: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("scale"))
    shift: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("shift"))
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_op_chain.output_scale_field()

    kind = "batch_normalization"

    def __attrs_post_init__(self) -> None:
        if self.src.ndims < 2:
            raise InvalidArgumentError(f"src dims {self.src.dims} must be (N, C, ...) with 2 or more dimensions")
        _resolve_dst_and_post_ops(self, self.src)
        c = self.src.dims[1]
        for name in ("mean", "variance", "scale", "shift"):
            _check_channel_param(name, getattr(self, name), c, "channel")

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return _with_operands(
            _present(src=self.src, scale=self.scale, shift=self.shift, mean=self.mean, variance=self.variance),
            self.post_ops, self.dst,
        )

    @property
    def label(self) -> str:
        return "batch_normalization:inference"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return _post_op_chain.generate_scaled(
            lambda chain: norm_kernels.generate_batch(
                dims=self.src.dims,
                src_strides=self.src.strides,
                dst_strides=self.dst.strides,
                epsilon=self.epsilon,
                mean_stride=self.mean.strides[0],
                variance_stride=self.variance.strides[0],
                scale_stride=None if self.scale is None else self.scale.strides[0],
                shift_stride=None if self.shift is None else self.shift.strides[0],
                config=config,
                post_ops=chain,
                src_dtype=self.src.dtype,
                dst_dtype=self.dst.dtype,
            ),
            self.post_ops,
            self.output_scale,
        )


def _groups(value) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"groups {value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"groups {value!r} must be an integer") from None


@attrs.frozen(cache_hash=True)
class GroupNormDesc(_NormStorage):
    """oneDNN's group normalization forward (inference): ``(N, C, spatial...)``, C in ``groups``.

    Mean and biased variance over (C/groups x spatial) per (n, group); then per channel
    ``y = (x - mean) / sqrt(var + epsilon) * scale[c] + shift[c]`` (``scale``/``shift`` dims
    ``(C,)``, optional). ``dst`` defaults to ``src``.
    """

    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    groups: int = attrs.field(converter=_groups)
    dst: MemoryDesc = attrs.field(default=None)
    epsilon: float = attrs.field(default=1e-5, converter=_epsilon, eq=_float_key)
    scale: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("scale"))
    shift: MemoryDesc | None = attrs.field(default=None, validator=_optional_md("shift"))
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_op_chain.output_scale_field()

    kind = "group_normalization"

    def __attrs_post_init__(self) -> None:
        if self.src.ndims < 2:
            raise InvalidArgumentError(f"src dims {self.src.dims} must be (N, C, ...) with 2 or more dimensions")
        c = self.src.dims[1]
        if self.groups < 1 or c % self.groups:
            raise InvalidArgumentError(f"groups {self.groups} must be positive and divide the {c} channels of src")
        _resolve_dst_and_post_ops(self, self.src)
        _check_channel_param("scale", self.scale, c, "channel")
        _check_channel_param("shift", self.shift, c, "channel")

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return _with_operands(_present(src=self.src, scale=self.scale, shift=self.shift), self.post_ops, self.dst)

    @property
    def label(self) -> str:
        return f"group_normalization:g{self.groups}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return _post_op_chain.generate_scaled(
            lambda chain: norm_kernels.generate_group(
                dims=self.src.dims,
                src_strides=self.src.strides,
                dst_strides=self.dst.strides,
                groups=self.groups,
                epsilon=self.epsilon,
                scale_stride=None if self.scale is None else self.scale.strides[0],
                shift_stride=None if self.shift is None else self.shift.strides[0],
                config=config,
                post_ops=chain,
                src_dtype=self.src.dtype,
                dst_dtype=self.dst.dtype,
            ),
            self.post_ops,
            self.output_scale,
        )


__all__ = ["BatchNormInferenceDesc", "GroupNormDesc", "LayerNormDesc", "PoolingDesc", "RMSNormDesc"]

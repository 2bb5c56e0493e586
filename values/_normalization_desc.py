"""The normalization descriptors (layer, RMS, batch inference, group), as values.

One concept: each normalises src into dst (``dst`` defaults to ``src``: same descriptor, in place
is then safe), with optional per-element ``scale`` and ``shift`` and oneDNN's attributes as
keywords: ``output_scale`` (finite, default 1; oneDNN v2's output scale, multiplying the
normalised output before the post-ops) and ``post_ops``, a chain of ``("eltwise", alg, alpha,
beta)``, ``("sum", scale)`` and ``("binary", alg, src1)`` applied to dst's values before the store
(the forms docs/primitives.md lists under "Post-op chains"); a binary operand broadcasts to dst. ``_Normalization`` holds
what they share: the checks of src, dst, the chain and the per-element parameters, the argument
order and the data type rule.

Optional arguments (``scale``, ``shift``, the statistics outputs: layer and group
normalization's ``mean``/``variance``, RMS normalization's ``rrms``) are None when absent and
then are not kernel arguments at all. Kernel argument order, of those present: src, scale,
shift, mean, variance (or rrms), the post-op operands ``post_op_{i}_src1``, dst.

Data types: ``src`` and ``dst`` may each have any data type (f32 math, any storage); ``scale``,
``shift``, ``mean``, ``variance`` and ``rrms`` are f32 only, as oneDNN's, and so are binary post-op
operands.
"""

from __future__ import annotations

import operator
from typing import ClassVar

import attrs

from . import _post_ops
from ._axes import axis_index, to_axis
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._numbers import finite_float, float_key
from ._op_desc import F32, Arg, OpDesc, check_memory_desc, memory_desc, op_kind

_F32_WHY = "scale, shift, mean and variance are f32 only (src and dst take any data type)"


def _f32(name: str, *, output: bool = False, optional: bool = True) -> Arg:
    """A parameter or statistics argument: f32 only, whatever src and dst hold (oneDNN's rule)."""
    return Arg(name, output=output, optional=optional, dtypes=F32, why=_F32_WHY)


def _epsilon(value) -> float:
    eps = finite_float("epsilon")(value)
    if eps < 0.0:
        raise InvalidArgumentError(f"epsilon {value!r} must be non-negative")
    return eps


def _groups(value) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"groups {value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"groups {value!r} must be an integer") from None


def _optional_md(name: str):
    def validate(instance, attribute, value) -> None:
        if value is not None:
            check_memory_desc(name, value)

    return validate


# Fields every normalization has; written as fields of each class rather than of the base, which
# would put them first (attrs orders a base's fields before its subclass's), out of each
# descriptor's positional order. (``src``, without a default, is spelled ``attrs.field(...)`` in
# each class: type checkers take a helper's result for a default, and a required field after it
# for an error.)
def _epsilon_field():
    return attrs.field(default=1e-5, converter=_epsilon, eq=float_key)


def _optional_field(name: str):
    return attrs.field(default=None, validator=_optional_md(name))


def _post_ops_field():
    return attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)


class _Normalization(OpDesc):
    """The checks, argument order and data type rule of the normalizations.

    ``__attrs_post_init__``: src of 2 or more dims, then ``_extent`` (the kind's own checks that
    precede dst's, returning the length of the per-element parameters), dst defaulted to src and
    checked, the post-op chain checked against it, each of ``PER_ELEMENT`` checked to be
    ``(extent,)``.
    """

    __slots__ = ()

    # Fields of every subclass (declared there, see above), read by the shared checks.
    src: MemoryDesc
    dst: MemoryDesc
    post_ops: tuple

    # How the rank error describes src: "must have 2 or more dimensions" or "must be (N, C, ...)
    # with 2 or more dimensions".
    SRC_SHAPE: ClassVar[str] = "have"
    # The optional or required (C,) arguments, and what each of their values is for.
    PER_ELEMENT: ClassVar[tuple[str, ...]] = ("scale", "shift")
    ELEMENT: ClassVar[str] = "channel"

    def __attrs_post_init__(self) -> None:
        if self.src.ndims < 2:
            raise InvalidArgumentError(f"src dims {self.src.dims} must {self.SRC_SHAPE} 2 or more dimensions")
        extent = self._extent()
        self._dst_like_src(self.src, self.dst)
        self._set("post_ops", _post_ops.check(self.post_ops, self.dst.dims))
        for name in self.PER_ELEMENT:
            md = getattr(self, name)
            if md is not None and md.dims != (extent,):
                raise ArgumentMismatchError(f"{name} dims {md.dims} must be ({extent},), one value per {self.ELEMENT}")

    def _extent(self) -> int:
        """The channel count (dim 1); subclasses normalising elsewhere, or checking more, override."""
        return self.src.dims[1]

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        """In kernel order: src and the parameters and statistics present (layer normalization's
        mean and variance are outputs, yet bind before the post-op operands, as the kernels take
        them), the post-op operands, dst."""
        descs = {arg.name: getattr(self, arg.name) for arg in self.ARGS if arg.name != "dst"}
        descs = {name: md for name, md in descs.items() if md is not None}
        descs.update(_post_ops.operands(self.post_ops))
        descs["dst"] = self.dst
        return descs


@op_kind
@attrs.frozen(cache_hash=True)
class LayerNormDesc(_Normalization):
    """oneDNN's layer normalization forward (inference), over ``axis`` (default the last).

    ``y = (x - mean) / sqrt(var + epsilon) * scale + shift``; ``scale`` and ``shift`` (dims
    ``(C,)``, C the normalised extent) are optional separate arguments; ``mean`` and ``variance``
    (dims = src dims without ``axis``) are optional outputs written when given. ``dst``
    defaults to ``src`` (same descriptor: in place is then safe). src needs 2 or more dims.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    axis: int = attrs.field(default=-1, converter=axis_index)
    epsilon: float = _epsilon_field()
    scale: MemoryDesc | None = _optional_field("scale")
    shift: MemoryDesc | None = _optional_field("shift")
    mean: MemoryDesc | None = _optional_field("mean")
    variance: MemoryDesc | None = _optional_field("variance")
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_ops.output_scale_field()

    kind = "layer_normalization"
    ARGS = (Arg("src"), _f32("scale"), _f32("shift"), _f32("mean", output=True), _f32("variance", output=True),
            Arg("dst", output=True))
    ELEMENT = "normalised element"

    def _extent(self) -> int:
        ndims = self.src.ndims
        self._set("axis", to_axis(self.axis, ndims, f"src of {ndims} dimensions {self.src.dims}"))
        return self.src.dims[self.axis]

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        axis = self.axis
        stat_dims = self.src.dims[:axis] + self.src.dims[axis + 1:]
        for name in ("mean", "variance"):
            md = getattr(self, name)
            if md is not None and md.dims != stat_dims:
                raise ArgumentMismatchError(f"{name} dims {md.dims} must be {stat_dims} (src dims without axis {axis})")


@op_kind
@attrs.frozen(cache_hash=True)
class RMSNormDesc(_Normalization):
    """RMS normalization over the last dim: ``y = x / sqrt(mean(x^2) + epsilon) * scale``.

    oneDNN's layer normalization with the ``rms_norm`` flag. ``scale`` (dims ``(C,)``) optional;
    ``rrms`` (dims = src dims without the last), an optional output, gets each row's
    ``1 / sqrt(mean(x^2) + epsilon)`` (oneDNN Graph's RMSNorm output 1). ``dst`` defaults to
    ``src``. src needs 2 or more dims.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    epsilon: float = _epsilon_field()
    scale: MemoryDesc | None = _optional_field("scale")
    rrms: MemoryDesc | None = _optional_field("rrms")
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_ops.output_scale_field()

    kind = "rms_normalization"
    ARGS = (Arg("src"), _f32("scale"), _f32("rrms", output=True), Arg("dst", output=True))
    PER_ELEMENT = ("scale",)
    ELEMENT = "normalised element"

    def _extent(self) -> int:
        return self.src.dims[-1]

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        rows = self.src.dims[:-1]
        if self.rrms is not None and self.rrms.dims != rows:
            raise ArgumentMismatchError(f"rrms dims {self.rrms.dims} must be {rows} (src dims without the last)")


@op_kind
@attrs.frozen(cache_hash=True)
class BatchNormInferenceDesc(_Normalization):
    """oneDNN's batch normalization forward inference with global statistics, channel = dim 1.

    ``y = scale / sqrt(variance + epsilon) * (x - mean) + shift``; ``mean``, ``variance``,
    ``scale``, ``shift`` have dims ``(C,)`` (the last two optional). ``dst`` defaults to ``src``.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    mean: MemoryDesc = attrs.field(validator=memory_desc("mean"))
    variance: MemoryDesc = attrs.field(validator=memory_desc("variance"))
    dst: MemoryDesc = attrs.field(default=None)
    epsilon: float = _epsilon_field()
    scale: MemoryDesc | None = _optional_field("scale")
    shift: MemoryDesc | None = _optional_field("shift")
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_ops.output_scale_field()

    kind = "batch_normalization"
    ARGS = (Arg("src"), _f32("scale"), _f32("shift"), _f32("mean", optional=False), _f32("variance", optional=False),
            Arg("dst", output=True))
    SRC_SHAPE = "be (N, C, ...) with"
    PER_ELEMENT = ("mean", "variance", "scale", "shift")

    @property
    def label(self) -> str:
        return "batch_normalization:inference"


@op_kind
@attrs.frozen(cache_hash=True)
class GroupNormDesc(_Normalization):
    """oneDNN's group normalization forward (inference): ``(N, C, spatial...)``, C in ``groups``.

    Mean and biased variance over (C/groups x spatial) per (n, group); then per channel
    ``y = (x - mean) / sqrt(var + epsilon) * scale[c] + shift[c]`` (``scale``/``shift`` dims
    ``(C,)``, optional). ``mean`` and ``variance`` (dims ``(N, groups)``) are optional outputs
    written when given (oneDNN Graph's GroupNorm with ``keep_stats``). ``dst`` defaults to ``src``.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    groups: int = attrs.field(converter=_groups)
    dst: MemoryDesc = attrs.field(default=None)
    epsilon: float = _epsilon_field()
    scale: MemoryDesc | None = _optional_field("scale")
    shift: MemoryDesc | None = _optional_field("shift")
    mean: MemoryDesc | None = _optional_field("mean")
    variance: MemoryDesc | None = _optional_field("variance")
    post_ops: tuple = _post_ops_field()
    output_scale: float = _post_ops.output_scale_field()

    kind = "group_normalization"
    ARGS = (Arg("src"), _f32("scale"), _f32("shift"), _f32("mean", output=True), _f32("variance", output=True),
            Arg("dst", output=True))
    SRC_SHAPE = "be (N, C, ...) with"

    def _extent(self) -> int:
        c = self.src.dims[1]
        if self.groups < 1 or c % self.groups:
            raise InvalidArgumentError(f"groups {self.groups} must be positive and divide the {c} channels of src")
        return c

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        stat_dims = (self.src.dims[0], self.groups)
        for name in ("mean", "variance"):
            md = getattr(self, name)
            if md is not None and md.dims != stat_dims:
                raise ArgumentMismatchError(f"{name} dims {md.dims} must be {stat_dims} (N, groups)")

    @property
    def label(self) -> str:
        return f"group_normalization:g{self.groups}"


__all__ = ["BatchNormInferenceDesc", "GroupNormDesc", "LayerNormDesc", "RMSNormDesc"]

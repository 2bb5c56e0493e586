"""The training side of normalization as values: batch normalization forward training, and batch and
layer normalization backward.

* ``BatchNormTrainingDesc``: oneDNN's batch normalization forward training, channel = dim 1: the
  batch's mean and biased variance per channel (written to the optional outputs ``mean`` and
  ``variance``), ``dst = scale * (x - mean) / sqrt(variance + epsilon) + shift``, and, where the old
  running statistics are given, the new ones as oneDNN Graph's BatchNormForwardTraining computes
  them: ``momentum * running + (1 - momentum) * batch`` (momentum defaults to 0.5, as there).
* ``BatchNormBackwardDesc``: oneDNN's batch normalization backward (``prop_kind::backward``, the
  statistics given): ``diff_src``, and the optional ``diff_scale``/``diff_shift`` per channel.
* ``LayerNormBackwardDesc``: oneDNN's layer normalization backward over the last dim, with the
  per-row statistics given: ``diff_src`` and the optional per-element ``diff_scale``/``diff_shift``.

As the forward normalizations: src, dst, diff_dst and diff_src take any storage type (f32 math);
the parameters, statistics and their gradients are f32 only. The statistics are over the data as
given, unpadded. Absent optional arguments are None, and no kernel argument.
"""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._normalization_desc import _epsilon_field, _f32, _optional_field
from ._numbers import finite_float, float_key
from ._op_desc import Arg, OpDesc, check_memory_desc, memory_desc, op_kind


def _check_rank(src: MemoryDesc, shape: str) -> None:
    if src.ndims < 2:
        raise InvalidArgumentError(f"src dims {src.dims} must {shape} 2 or more dimensions")


def _check_like(name: str, md: MemoryDesc, src: MemoryDesc) -> None:
    check_memory_desc(name, md)
    if md.dims != src.dims:
        raise ArgumentMismatchError(f"{name} dims {md.dims} differ from src dims {src.dims}")


def _check_dims(desc: OpDesc, names: tuple[str, ...], dims: tuple[int, ...], what: str) -> None:
    for name in names:
        md = getattr(desc, name)
        if md is not None and md.dims != dims:
            raise ArgumentMismatchError(f"{name} dims {md.dims} must be {dims}, {what}")


def _check_pairs(desc: OpDesc, pairs: tuple[tuple[str, str], ...]) -> None:
    """Each pair given together or not at all (an input and the output computed from it)."""
    for a, b in pairs:
        if (getattr(desc, a) is None) != (getattr(desc, b) is None):
            given, missing = (a, b) if getattr(desc, b) is None else (b, a)
            raise InvalidArgumentError(f"{given} is given without {missing}: the two go together")


def _momentum(value) -> float:
    return finite_float("momentum")(value)


@op_kind
@attrs.frozen(cache_hash=True)
class BatchNormTrainingDesc(OpDesc):
    """Batch normalization forward training over channel dim 1 (see the module docstring).

    ``mean``/``variance`` (outputs) get the batch statistics; ``running_mean``/``running_variance``
    (inputs) and ``running_mean_dst``/``running_variance_dst`` (outputs) go in pairs. All of them,
    ``scale`` and ``shift`` have dims ``(C,)``. ``dst`` defaults to ``src``.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    epsilon: float = _epsilon_field()
    momentum: float = attrs.field(default=0.5, converter=_momentum, eq=float_key)
    scale: MemoryDesc | None = _optional_field("scale")
    shift: MemoryDesc | None = _optional_field("shift")
    mean: MemoryDesc | None = _optional_field("mean")
    variance: MemoryDesc | None = _optional_field("variance")
    running_mean: MemoryDesc | None = _optional_field("running_mean")
    running_variance: MemoryDesc | None = _optional_field("running_variance")
    running_mean_dst: MemoryDesc | None = _optional_field("running_mean_dst")
    running_variance_dst: MemoryDesc | None = _optional_field("running_variance_dst")

    kind = "batch_normalization_training"
    ARGS = (Arg("src"), _f32("scale"), _f32("shift"), _f32("running_mean"), _f32("running_variance"),
            Arg("dst", output=True), _f32("mean", output=True), _f32("variance", output=True),
            _f32("running_mean_dst", output=True), _f32("running_variance_dst", output=True))
    PER_CHANNEL = ("scale", "shift", "mean", "variance", "running_mean", "running_variance",
                   "running_mean_dst", "running_variance_dst")

    def __attrs_post_init__(self) -> None:
        _check_rank(self.src, "be (N, C, ...) with")
        if self.dst is None:
            self._set("dst", self.src)
        _check_like("dst", self.dst, self.src)
        _check_dims(self, self.PER_CHANNEL, (self.src.dims[1],), "one value per channel")
        _check_pairs(self, (("running_mean", "running_mean_dst"), ("running_variance", "running_variance_dst")))

    @property
    def label(self) -> str:
        return "batch_normalization:training"


@op_kind
@attrs.frozen(cache_hash=True)
class BatchNormBackwardDesc(OpDesc):
    """Batch normalization backward over channel dim 1, with the forward's batch ``mean`` and
    ``variance`` (dims ``(C,)``)::

        diff_shift = sum(diff_dst),  diff_scale = sum(diff_dst * (x - mean)) * inv
        diff_src = scale * inv * (diff_dst - diff_shift / M - (x - mean) * inv * diff_scale / M)

    sums over the M elements of a channel, ``inv = 1 / sqrt(variance + epsilon)``, scale 1 when
    absent. ``diff_scale``/``diff_shift`` are optional outputs; ``diff_src`` defaults to ``src``.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    mean: MemoryDesc = attrs.field(validator=memory_desc("mean"))
    variance: MemoryDesc = attrs.field(validator=memory_desc("variance"))
    diff_src: MemoryDesc = attrs.field(default=None)
    epsilon: float = _epsilon_field()
    scale: MemoryDesc | None = _optional_field("scale")
    diff_scale: MemoryDesc | None = _optional_field("diff_scale")
    diff_shift: MemoryDesc | None = _optional_field("diff_shift")

    kind = "batch_normalization_backward"
    ARGS = (Arg("src"), Arg("diff_dst"), _f32("mean", optional=False), _f32("variance", optional=False),
            _f32("scale"), Arg("diff_src", output=True), _f32("diff_scale", output=True),
            _f32("diff_shift", output=True))

    def __attrs_post_init__(self) -> None:
        _check_rank(self.src, "be (N, C, ...) with")
        _check_like("diff_dst", self.diff_dst, self.src)
        if self.diff_src is None:
            self._set("diff_src", self.src)
        _check_like("diff_src", self.diff_src, self.src)
        _check_dims(self, ("mean", "variance", "scale", "diff_scale", "diff_shift"), (self.src.dims[1],),
                    "one value per channel")

    @property
    def label(self) -> str:
        return "batch_normalization:backward"


@op_kind
@attrs.frozen(cache_hash=True)
class LayerNormBackwardDesc(OpDesc):
    """Layer normalization backward over the last dim (C elements a row), with the forward's
    per-row ``mean`` and ``variance`` (dims = src dims without the last)::

        g = diff_dst * scale,  xhat = (x - mean) * inv
        diff_src = inv * (g - sum(g) / C - xhat * sum(g * xhat) / C)        (sums over the row)
        diff_scale = sum(diff_dst * xhat),  diff_shift = sum(diff_dst)     (sums over the rows)

    ``inv = 1 / sqrt(variance + epsilon)``, scale 1 when absent; ``scale``, ``diff_scale`` and
    ``diff_shift`` have dims ``(C,)``, the last two optional outputs. ``diff_src`` defaults to ``src``.
    """

    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    mean: MemoryDesc = attrs.field(validator=memory_desc("mean"))
    variance: MemoryDesc = attrs.field(validator=memory_desc("variance"))
    diff_src: MemoryDesc = attrs.field(default=None)
    epsilon: float = _epsilon_field()
    scale: MemoryDesc | None = _optional_field("scale")
    diff_scale: MemoryDesc | None = _optional_field("diff_scale")
    diff_shift: MemoryDesc | None = _optional_field("diff_shift")

    kind = "layer_normalization_backward"
    ARGS = BatchNormBackwardDesc.ARGS

    def __attrs_post_init__(self) -> None:
        _check_rank(self.src, "have")
        _check_like("diff_dst", self.diff_dst, self.src)
        if self.diff_src is None:
            self._set("diff_src", self.src)
        _check_like("diff_src", self.diff_src, self.src)
        rows = self.src.dims[:-1]
        _check_dims(self, ("mean", "variance"), rows, "src dims without the last")
        _check_dims(self, ("scale", "diff_scale", "diff_shift"), (self.src.dims[-1],),
                    "one value per normalised element")


__all__ = ["BatchNormBackwardDesc", "BatchNormTrainingDesc", "LayerNormBackwardDesc"]

"""Operation descriptors for softmax and reduction: what they compute, as hashable values.

Kept apart from ``_primitive_desc`` (eltwise, binary) so the two sets of kinds can change
independently; they share its argument checks, so errors read the same for every kind.
"""

from __future__ import annotations

import operator

import attrs

from ._values._errors import ArgumentMismatchError, InvalidArgumentError
from ._values._memory_desc import MemoryDesc
from ._primitive_desc import AnyStorage, _memory_desc
from . import _post_op_chain
from .kernels import _post_ops as post_op_kernels
from .kernels import KernelConfig, KernelSpec
from .kernels import reduction as reduction_kernels
from .kernels import softmax as softmax_kernels


def _to_axis(value) -> int:
    # operator.index accepts ints and numpy integers but not floats; bools are ints to Python
    # and would silently mean axis 0 or 1, so they are refused by name.
    if isinstance(value, bool):
        raise InvalidArgumentError(f"axis {value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"axis {value!r} must be an integer") from None


@attrs.frozen(cache_hash=True)
class SoftmaxDesc(AnyStorage):
    """``dst = alg(src)`` over ``axis``; ``alg`` is ``"softmax"`` or ``"logsoftmax"``.

    ``src`` and ``dst`` may each have any data type (``AnyStorage``; f32 math), e.g. f32 scores
    into a bf16 or f16 dst; binary post-op operands are f32.

    ``axis`` may be negative, as numpy's; it is stored normalised, so ``axis=-1`` and the last
    index make one descriptor (and one cache entry). ``dst`` defaults to ``src`` (same dims and
    layout); any strides are accepted for either, the dims must match.

    ``output_scale`` (keyword, finite, default 1): oneDNN v2's output scale, multiplying the
    softmax (or logsoftmax) before the post-ops. ``post_ops`` (keyword): a chain of
    ``("eltwise", alg, alpha, beta)``, ``("sum", scale)`` and ``("binary", alg, src1)`` applied to
    the result before the store (see ``triodnn._post_op_chain``); a binary operand broadcasts to
    dst and is the argument ``post_op_{i}_src1``.
    """

    alg: str = attrs.field()
    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    axis: int = attrs.field(default=-1, converter=_to_axis)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_op_chain.eq_key)
    output_scale: float = _post_op_chain.output_scale_field()

    kind = "softmax"

    @alg.validator
    def _check_alg(self, attribute, value) -> None:
        if value not in softmax_kernels.ALGORITHMS:
            raise InvalidArgumentError(
                f"alg {value!r} is not a softmax algorithm; known: "
                f"{', '.join(softmax_kernels.ALGORITHMS)}"
            )

    def __attrs_post_init__(self) -> None:
        ndims = self.src.ndims
        if not -ndims <= self.axis < ndims:
            raise InvalidArgumentError(
                f"axis {self.axis} is out of range for src of {ndims} dimensions {self.src.dims}"
            )
        object.__setattr__(self, "axis", self.axis % ndims)
        if self.dst is None:
            object.__setattr__(self, "dst", self.src)
        _memory_desc("dst")(self, None, self.dst)
        if self.dst.dims != self.src.dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from src dims {self.src.dims}"
            )
        object.__setattr__(self, "post_ops", _post_op_chain.check(self.post_ops, self.dst.dims))

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": self.src, **post_op_kernels.operands(self.post_ops), "dst": self.dst}

    @property
    def label(self) -> str:
        return f"softmax:{self.alg}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return _post_op_chain.generate_scaled(
            lambda chain: softmax_kernels.generate(
                self.alg,
                dims=self.src.dims,
                src_strides=self.src.strides,
                dst_strides=self.dst.strides,
                axis=self.axis,
                config=config,
                post_ops=chain,
                src_dtype=self.src.dtype,
                dst_dtype=self.dst.dtype,
            ),
            self.post_ops,
            self.output_scale,
        )


@attrs.frozen(cache_hash=True)
class ReductionDesc(AnyStorage):
    """``dst = alg`` of ``src`` over the dimensions where ``dst`` has 1 (oneDNN's convention).

    ``src`` and ``dst`` may each have any data type (``AnyStorage``): f32 accumulation, the result
    stored with dst's conversion (e.g. bf16 src into an f32 dst).

    ``alg``: ``sum``, ``mean``, ``max``, ``min``, ``mul`` (product), ``l1`` (sum of |x|) or
    ``l2`` (sqrt of the sum of squares): oneDNN's ``norm_lp_sum`` with p=1, p=2 and eps=0.
    ``dst`` has src's rank, each dim equal to src's or 1; it is required, since which dims
    reduce is exactly what it says.
    """

    alg: str = attrs.field()
    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    dst: MemoryDesc = attrs.field(validator=_memory_desc("dst"))

    kind = "reduction"

    @alg.validator
    def _check_alg(self, attribute, value) -> None:
        if value not in reduction_kernels.ALGORITHMS:
            raise InvalidArgumentError(
                f"alg {value!r} is not a reduction algorithm; known: "
                f"{', '.join(reduction_kernels.ALGORITHMS)}"
            )

    def __attrs_post_init__(self) -> None:
        try:
            reduction_kernels.reduced_axes(self.src.dims, self.dst.dims)
        except ValueError as exc:
            raise ArgumentMismatchError(str(exc)) from None

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": self.src, "dst": self.dst}

    @property
    def label(self) -> str:
        return f"reduction:{self.alg}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return reduction_kernels.generate(
            self.alg,
            src_dims=self.src.dims,
            src_strides=self.src.strides,
            dst_dims=self.dst.dims,
            dst_strides=self.dst.strides,
            config=config,
            src_dtype=self.src.dtype,
            dst_dtype=self.dst.dtype,
        )

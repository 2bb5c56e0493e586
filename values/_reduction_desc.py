"""The reduction descriptor: ``alg`` over the dimensions where dst has 1, as a value; and the
algorithm names and reduced-axes rule it validates against (the kernel uses them too)."""

from __future__ import annotations

import attrs

from ._errors import ArgumentMismatchError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, algorithm, memory_desc, op_kind

# By oneDNN name: sum, mean, max, min, mul (product), and norm_lp_sum with p=1 and p=2 (eps 0),
# named here l1 (sum of |x|) and l2 (sqrt of the sum of squares).
REDUCTION_ALGORITHMS: tuple[str, ...] = ("sum", "mean", "max", "min", "mul", "l1", "l2")


def reduced_axes(src_dims: tuple[int, ...], dst_dims: tuple[int, ...]) -> tuple[int, ...]:
    """Axes that are reduced: ``dst`` has 1 where ``src`` has more. ValueError when the dims
    are not of that form (another rank, or a dst dim that is neither the src dim nor 1)."""
    if len(src_dims) != len(dst_dims):
        raise ValueError(f"dst dims {dst_dims} and src dims {src_dims} differ in rank")
    bad = [i for i, (s, d) in enumerate(zip(src_dims, dst_dims)) if d != s and d != 1]
    if bad:
        raise ValueError(
            f"dst dims {dst_dims} must equal src dims {src_dims} or be 1 (dimension {bad[0]})"
        )
    return tuple(i for i, (s, d) in enumerate(zip(src_dims, dst_dims)) if d == 1 and s > 1)


@op_kind
@attrs.frozen(cache_hash=True)
class ReductionDesc(OpDesc):
    """``dst = alg`` of ``src`` over the dimensions where ``dst`` has 1 (oneDNN's convention).

    ``src`` and ``dst`` may each have any data type (f32 math, any storage): f32 accumulation,
    the result stored with dst's conversion (e.g. bf16 src into an f32 dst).

    ``alg``: ``sum``, ``mean``, ``max``, ``min``, ``mul`` (product), ``l1`` (sum of |x|) or
    ``l2`` (sqrt of the sum of squares): oneDNN's ``norm_lp_sum`` with p=1, p=2 and eps=0.
    ``dst`` has src's rank, each dim equal to src's or 1; it is required, since which dims
    reduce is exactly what it says.
    """

    alg: str = attrs.field(validator=algorithm("a reduction", REDUCTION_ALGORITHMS))
    src: MemoryDesc = attrs.field(validator=memory_desc("src"))
    dst: MemoryDesc = attrs.field(validator=memory_desc("dst"))

    kind = "reduction"
    ARGS = (Arg("src"), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        try:
            reduced_axes(self.src.dims, self.dst.dims)
        except ValueError as exc:
            raise ArgumentMismatchError(str(exc)) from None

    @property
    def axes(self) -> tuple[int, ...]:
        """The reduced axes (``reduced_axes`` of src's and dst's dims)."""
        return reduced_axes(self.src.dims, self.dst.dims)

"""The fused scaled-dot-product attention descriptor (oneDNN Graph's SDPA partitions), and the
vocabulary and batch broadcasting it validates against."""

from __future__ import annotations

import attrs

from ._algorithms import broadcast_dims
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, memory_desc, op_kind

CAUSAL: tuple[str, ...] = ("top_left", "bottom_right")
SCALE_MODES: tuple[str, ...] = ("multiply", "divide")
FLOAT_DTYPES: tuple[str, ...] = ("f32", "bf16", "f16")


def _optional_memory_desc(name: str):
    def validate(instance, attribute, value) -> None:
        if value is not None:
            check_memory_desc(name, value)

    return validate


def _one_of(name: str, allowed: tuple):
    def validate(instance, attribute, value) -> None:
        if value not in allowed:
            raise InvalidArgumentError(
                f"{name} {value!r} is not one of {', '.join(map(repr, allowed))}"
            )

    return validate


@op_kind
@attrs.frozen(cache_hash=True)
class SdpaDesc(OpDesc):
    """``dst = softmax(scale_op(query @ key^T) + mask) @ value`` per batch index, fused: the score
    matrix never reaches global memory (online softmax, see ``triodnn.kernels.sdpa``).

    ``query`` is (…, Sq, D), ``key`` (…, Skv, D) in its natural layout (a graph's transposed K,
    or ``transpose_b``, is the same dims with swapped strides: any strides are accepted for every
    argument), ``value`` (…, Skv, Dv); ``dst`` defaults to the dense (batch…, Sq, Dv) of query's
    data type. Batch dims broadcast as numpy's between query, key, value and mask: K/V heads of
    size 1 broadcast over Q's heads (GQA, e.g. Q (b, kv_heads, group, Sq, D) with K
    (b, kv_heads, 1, Skv, D)).

    Keywords: ``mask``, an additive float mask broadcasting to (…, Sq, Skv); ``scale``, a
    one-element memory that multiplies (``scale_mode="multiply"``) or divides (``"divide"``)
    the scores before the mask (without a scale, ``scale_mode`` is stored as "multiply");
    ``causal``: None, ``"top_left"`` (scores with kv > q become
    -inf) or ``"bottom_right"`` (kv > q + Skv - Sq). A row with every score -inf gives 0
    (oneDNN's ``inf_as_zero``).

    Data types: query, key, value, dst, mask and scale each f32, bf16 or f16; f32 math.
    Execution arguments: query, key, value, [scale], [mask], dst.
    """

    query: MemoryDesc = attrs.field(validator=memory_desc("query"))
    key: MemoryDesc = attrs.field(validator=memory_desc("key"))
    value: MemoryDesc = attrs.field(validator=memory_desc("value"))
    dst: MemoryDesc = attrs.field(default=None)
    mask: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=_optional_memory_desc("mask"))
    scale: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=_optional_memory_desc("scale"))
    scale_mode: str = attrs.field(default="multiply", kw_only=True, validator=_one_of("scale_mode", SCALE_MODES))
    causal: str | None = attrs.field(default=None, kw_only=True, validator=_one_of("causal", (None,) + CAUSAL))

    kind = "sdpa"
    ARGS = (
        Arg("query", dtypes=FLOAT_DTYPES),
        Arg("key", dtypes=FLOAT_DTYPES),
        Arg("value", dtypes=FLOAT_DTYPES),
        Arg("scale", optional=True, dtypes=FLOAT_DTYPES),
        Arg("mask", optional=True, dtypes=FLOAT_DTYPES),
        Arg("dst", output=True, dtypes=FLOAT_DTYPES),
    )

    def __attrs_post_init__(self) -> None:
        for name in ("query", "key", "value"):
            md = getattr(self, name)
            if md.ndims < 2:
                raise InvalidArgumentError(f"{name} dims {md.dims} need at least 2 dimensions (rows, head size)")
        (sq, d), (skv, dk), (skv_v, dv) = self.query.dims[-2:], self.key.dims[-2:], self.value.dims[-2:]
        if d != dk:
            raise ArgumentMismatchError(
                f"query dims {self.query.dims} have head size D={d} but key dims {self.key.dims} have D={dk}"
            )
        if skv != skv_v:
            raise ArgumentMismatchError(
                f"key dims {self.key.dims} have {skv} rows (Skv) but value dims {self.value.dims} have {skv_v}"
            )
        batches = {"query": self.query.dims[:-2], "key": self.key.dims[:-2], "value": self.value.dims[:-2]}
        if self.mask is not None:
            mask_dims = (1,) * max(0, 2 - self.mask.ndims) + self.mask.dims
            if mask_dims[-2] not in (1, sq) or mask_dims[-1] not in (1, skv):
                raise ArgumentMismatchError(
                    f"mask dims {self.mask.dims} do not broadcast to the scores' (Sq, Skv) = ({sq}, {skv})"
                )
            batches["mask"] = mask_dims[:-2]
        try:
            batch = broadcast_dims(*batches.values())
        except ValueError:
            of = ", ".join(f"{name} {dims}" for name, dims in batches.items())
            raise ArgumentMismatchError(f"batch dims of {of} do not broadcast") from None
        if self.scale is None:
            self._set("scale_mode", "multiply")  # no scale: one descriptor either way
        elif self.scale.nelems != 1:
            raise ArgumentMismatchError(f"scale dims {self.scale.dims} hold {self.scale.nelems} elements; expected one")
        dims = batch + (sq, dv)
        if self.dst is None:
            self._set("dst", MemoryDesc(dims, self.query.dtype))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from the attention output dims {dims} "
                f"(broadcast batch, Sq of query, Dv of value)"
            )

    @property
    def label(self) -> str:
        return "sdpa" if self.causal is None else f"sdpa:causal_{self.causal}"

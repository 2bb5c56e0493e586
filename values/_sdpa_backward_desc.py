"""The fused SDPA backward descriptor (oneDNN's training SDPA backward graphs), one primitive per
part of the gradients: dQ, or dK with dV."""

from __future__ import annotations

import attrs

from ._algorithms import broadcast_dims
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, memory_desc, one_of, op_kind, optional_memory_desc
from ._sdpa_desc import CAUSAL, FLOAT_DTYPES, SCALE_MODES

PARTS: tuple[str, ...] = ("dq", "dkdv")


@op_kind
@attrs.frozen(cache_hash=True)
class SdpaBackwardDesc(OpDesc):
    """The gradients of ``dst = softmax(scale_op(query @ key^T) + mask) @ value`` from the
    forward's ``dst`` (O), its softmax ``stats`` (each row's logsumexp of the scaled, masked
    scores, f32, (…, Sq, 1)) and ``diff_dst`` (dO), without the (Sq, Skv) matrices in memory:
    ``P = exp(scores - stats)``, ``dS = P * (dO @ V^T - rowsum(dO * O))``, scaled as the scores
    were; ``part="dq"`` writes ``diff_query = dS @ K``, ``part="dkdv"`` writes
    ``diff_key = dS^T @ Q`` and ``diff_value = P^T @ dO``.

    ``query`` is (…, Sq, D), ``key`` (…, Skv, D), ``value`` (…, Skv, Dv), ``dst`` and ``diff_dst``
    (…, Sq, Dv), all with the same batch dims (K/V heads broadcast over query heads, GQA, are not
    taken), any strides; the gradients have their input's dims. ``scale`` (one element,
    ``scale_mode`` "multiply" or "divide"), ``mask`` (additive, broadcasting to (…, Sq, Skv)) and
    ``causal`` mean what they mean for ``SdpaDesc``. Storage f32, bf16 or f16, f32 math.
    ``delta_out`` (dq only, f32 (…, Sq, 1)) receives each row's ``D_i = rowsum(dO * O)``, which
    ``delta`` (dkdv only) then provides instead of recomputing it per key row.
    Execution arguments: query, key, value, dst, diff_dst, stats, [scale], [mask], [delta], then
    diff_query, [delta_out] (dq) or diff_key, diff_value (dkdv).
    """

    part: str = attrs.field(validator=one_of("part", PARTS))
    query: MemoryDesc = attrs.field(validator=memory_desc("query"))
    key: MemoryDesc = attrs.field(validator=memory_desc("key"))
    value: MemoryDesc = attrs.field(validator=memory_desc("value"))
    dst: MemoryDesc = attrs.field(validator=memory_desc("dst"))
    diff_dst: MemoryDesc = attrs.field(validator=memory_desc("diff_dst"))
    stats: MemoryDesc = attrs.field(validator=memory_desc("stats"))
    diff_query: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                                validator=optional_memory_desc("diff_query"))
    diff_key: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                              validator=optional_memory_desc("diff_key"))
    diff_value: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                                validator=optional_memory_desc("diff_value"))
    scale: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("scale"))
    scale_mode: str = attrs.field(default="multiply", kw_only=True, validator=one_of("scale_mode", SCALE_MODES))
    mask: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("mask"))
    causal: str | None = attrs.field(default=None, kw_only=True, validator=one_of("causal", (None,) + CAUSAL))
    delta: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("delta"))
    delta_out: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                               validator=optional_memory_desc("delta_out"))

    kind = "sdpa_backward"
    ARGS = (
        Arg("query", dtypes=FLOAT_DTYPES),
        Arg("key", dtypes=FLOAT_DTYPES),
        Arg("value", dtypes=FLOAT_DTYPES),
        Arg("dst", dtypes=FLOAT_DTYPES),
        Arg("diff_dst", dtypes=FLOAT_DTYPES),
        Arg("stats", dtypes=("f32",)),
        Arg("scale", optional=True, dtypes=FLOAT_DTYPES),
        Arg("mask", optional=True, dtypes=FLOAT_DTYPES),
        Arg("delta", optional=True, dtypes=("f32",)),
        Arg("diff_query", output=True, optional=True, dtypes=FLOAT_DTYPES),
        Arg("diff_key", output=True, optional=True, dtypes=FLOAT_DTYPES),
        Arg("diff_value", output=True, optional=True, dtypes=FLOAT_DTYPES),
        Arg("delta_out", output=True, optional=True, dtypes=("f32",)),
    )

    def __attrs_post_init__(self) -> None:
        for name in ("query", "key", "value", "dst", "diff_dst", "stats"):
            md = getattr(self, name)
            if md.ndims < 2:
                raise InvalidArgumentError(f"{name} dims {md.dims} need at least 2 dimensions (rows, columns)")
        (sq, d), (skv, dk), (skv_v, dv) = self.query.dims[-2:], self.key.dims[-2:], self.value.dims[-2:]
        if d != dk:
            raise ArgumentMismatchError(
                f"query dims {self.query.dims} have head size D={d} but key dims {self.key.dims} have D={dk}")
        if skv != skv_v:
            raise ArgumentMismatchError(
                f"key dims {self.key.dims} have {skv} rows (Skv) but value dims {self.value.dims} have {skv_v}")
        batch = self.query.dims[:-2]
        expected = {"key": batch + (skv, d), "value": batch + (skv, dv), "dst": batch + (sq, dv),
                    "diff_dst": batch + (sq, dv), "stats": batch + (sq, 1)}
        for name, dims in expected.items():
            if getattr(self, name).dims != dims:
                raise ArgumentMismatchError(
                    f"{name} dims {getattr(self, name).dims} differ from {dims} (query's batch dims, "
                    f"Sq={sq}, Skv={skv}, D={d}, Dv={dv}): K/V heads broadcast over query heads are not taken")
        if self.mask is not None:
            mask_dims = (1,) * max(0, 2 - self.mask.ndims) + self.mask.dims
            if mask_dims[-2] not in (1, sq) or mask_dims[-1] not in (1, skv):
                raise ArgumentMismatchError(
                    f"mask dims {self.mask.dims} do not broadcast to the scores' (Sq, Skv) = ({sq}, {skv})")
            try:
                if broadcast_dims(batch, mask_dims[:-2]) != batch:
                    raise ValueError
            except ValueError:
                raise ArgumentMismatchError(
                    f"mask dims {self.mask.dims} do not broadcast to the batch dims {batch}") from None
        if self.scale is None:
            self._set("scale_mode", "multiply")  # no scale: one descriptor either way
        elif self.scale.nelems != 1:
            raise ArgumentMismatchError(f"scale dims {self.scale.dims} hold {self.scale.nelems} elements; expected one")
        for name, part in (("delta_out", "dq"), ("delta", "dkdv")):
            md = getattr(self, name)
            if md is None:
                continue
            if self.part != part:
                raise InvalidArgumentError(f"part {self.part!r} takes no {name} (only part {part!r} does)")
            if md.dims != batch + (sq, 1):
                raise ArgumentMismatchError(f"{name} dims {md.dims} differ from the per-row dims {batch + (sq, 1)}")
        wanted = {"dq": ("diff_query",), "dkdv": ("diff_key", "diff_value")}[self.part]
        like = {"diff_query": self.query, "diff_key": self.key, "diff_value": self.value}
        for name, source in like.items():
            md = getattr(self, name)
            if name not in wanted:
                if md is not None:
                    raise InvalidArgumentError(f"part {self.part!r} does not write {name}")
                continue
            if md is None:
                self._set(name, MemoryDesc(source.dims, source.dtype))
                md = getattr(self, name)
            if md.dims != source.dims:
                raise ArgumentMismatchError(f"{name} dims {md.dims} differ from {source.dims}")

    @property
    def label(self) -> str:
        return f"sdpa_backward:{self.part}"

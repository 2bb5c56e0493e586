"""The fused scaled-dot-product attention descriptor (oneDNN Graph's SDPA partitions), and the
vocabulary and batch broadcasting it validates against."""

from __future__ import annotations

import attrs

from ._algorithms import broadcast_dims
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, memory_desc, one_of, op_kind, optional_memory_desc
from ._quantization import QUANTIZED_TYPES, ROUNDINGS, Quantization

CAUSAL: tuple[str, ...] = ("top_left", "bottom_right")
SCALE_MODES: tuple[str, ...] = ("multiply", "divide")
FLOAT_DTYPES: tuple[str, ...] = ("f32", "bf16", "f16")
OPERAND_DTYPES: tuple[str, ...] = FLOAT_DTYPES + QUANTIZED_TYPES
_QUANT_OPERANDS = ("query", "key", "value")


def _optional_quantization(name: str):
    def validate(instance, attribute, value) -> None:
        if value is not None and not isinstance(value, Quantization):
            raise InvalidArgumentError(f"{name} must be a Quantization or None, not {type(value).__name__}")

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

    Keywords, in the order the kernel applies them to a score: ``scale``, a one-element memory
    that multiplies (``scale_mode="multiply"``) or divides (``"divide"``) the scores (without a
    scale, ``scale_mode`` is stored as "multiply"); ``softcap``, one element: scores become
    ``softcap * tanh(score)`` (gemma2's soft-capping); ``select_mask``, a boolean (or u8) tensor
    broadcasting to (…, Sq, Skv), with ``fill``, one element: scores where ``select_mask`` is
    ``fill_if`` become ``fill`` (oneDNN's ``Select(cond, scores, fill)`` is ``fill_if=False``,
    ``Select(cond, fill, scores)`` is ``fill_if=True``); with ``fill_before_scale`` the Select
    came before the scale in the graph, so ``fill`` is scaled too (softcap excluded); ``mask``,
    an additive float mask broadcasting to (…, Sq, Skv); ``causal``: None, ``"top_left"``
    (scores with kv > q are masked) or ``"bottom_right"`` (kv > q + Skv - Sq), masked scores
    becoming -inf, or ``fill`` where one is given (GenIndex/GreaterEqual/Select graphs). A row
    with every score -inf gives 0 (oneDNN's ``inf_as_zero``). ``causal_add`` and ``causal_sub``,
    one-element s32 memories (host scalars in graphs), give bottom_right's offset at run time:
    kv > q + causal_add - causal_sub is masked (Skv - Sq when neither is given). ``stats``, an optional f32
    output (…, Sq, 1): each row's ``max + log(sum(exp(score - max)))``, SoftMax's second output.

    Quantized attention (oneDNN's int8, fp8 and compressed-K/V graphs): ``query_quant``,
    ``key_quant``, ``value_quant`` (``Quantization``) say how a query, key or value stored as
    s8/u8/s4/u4/f8 maps to real values, the kernel dequantizing as it loads; a grouped key or value
    quantization takes its run-time scales (``key_scales``/``value_scales``, f32/f16/bf16) and
    optional zero points (``key_zps``/``value_zps``, the operand's type) shaped as the operand in
    the kernel's (…, Skv, D) / (…, Skv, Dv) view with the last two dims divided by the group.
    ``probs_quant``: the probabilities go through Quantize -> Dequantize before the second
    product (a second pass over the keys normalises them first: a quantized probability needs
    the row's final sum); ``dst_quant``: dst is stored quantized (its dtype the quantization's).
    ``score_rounding``: the float type the graph rounds each score op's result to (bf16 scores
    of the int8 bf16 graphs), so that the kernel's scores are the graph's.

    Data types: query, key, value each f32, bf16 or f16 (or quantized, as above); dst, mask,
    scale, softcap and fill each f32, bf16 or f16; f32 math. Execution arguments: query, key,
    value, [scale], [softcap], [select_mask], [fill], [mask], [causal_add], [causal_sub],
    [key_scales], [key_zps], [value_scales], [value_zps], dst, [stats].
    """

    query: MemoryDesc = attrs.field(validator=memory_desc("query"))
    key: MemoryDesc = attrs.field(validator=memory_desc("key"))
    value: MemoryDesc = attrs.field(validator=memory_desc("value"))
    dst: MemoryDesc = attrs.field(default=None)
    mask: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("mask"))
    scale: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("scale"))
    scale_mode: str = attrs.field(default="multiply", kw_only=True, validator=one_of("scale_mode", SCALE_MODES))
    causal: str | None = attrs.field(default=None, kw_only=True, validator=one_of("causal", (None,) + CAUSAL))
    softcap: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("softcap"))
    select_mask: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                                 validator=optional_memory_desc("select_mask"))
    fill: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("fill"))
    fill_if: bool = attrs.field(default=False, kw_only=True, converter=bool)
    fill_before_scale: bool = attrs.field(default=False, kw_only=True, converter=bool)
    stats: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("stats"))
    causal_add: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                                validator=optional_memory_desc("causal_add"))
    causal_sub: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                                validator=optional_memory_desc("causal_sub"))
    query_quant: Quantization | None = attrs.field(default=None, kw_only=True,
                                                   validator=_optional_quantization("query_quant"))
    key_quant: Quantization | None = attrs.field(default=None, kw_only=True,
                                                 validator=_optional_quantization("key_quant"))
    value_quant: Quantization | None = attrs.field(default=None, kw_only=True,
                                                   validator=_optional_quantization("value_quant"))
    probs_quant: Quantization | None = attrs.field(default=None, kw_only=True,
                                                   validator=_optional_quantization("probs_quant"))
    dst_quant: Quantization | None = attrs.field(default=None, kw_only=True,
                                                 validator=_optional_quantization("dst_quant"))
    key_scales: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                                validator=optional_memory_desc("key_scales"))
    key_zps: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=optional_memory_desc("key_zps"))
    value_scales: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                                  validator=optional_memory_desc("value_scales"))
    value_zps: MemoryDesc | None = attrs.field(default=None, kw_only=True,
                                               validator=optional_memory_desc("value_zps"))
    score_rounding: str = attrs.field(default="f32", kw_only=True, validator=one_of("score_rounding", ROUNDINGS))

    kind = "sdpa"
    ARGS = (
        Arg("query", dtypes=OPERAND_DTYPES),
        Arg("key", dtypes=OPERAND_DTYPES),
        Arg("value", dtypes=OPERAND_DTYPES),
        Arg("scale", optional=True, dtypes=FLOAT_DTYPES),
        Arg("softcap", optional=True, dtypes=FLOAT_DTYPES),
        Arg("select_mask", optional=True, dtypes=("boolean", "u8")),
        Arg("fill", optional=True, dtypes=FLOAT_DTYPES),
        Arg("mask", optional=True, dtypes=FLOAT_DTYPES),
        Arg("causal_add", optional=True, dtypes=("s32",)),
        Arg("causal_sub", optional=True, dtypes=("s32",)),
        Arg("key_scales", optional=True, dtypes=FLOAT_DTYPES),
        Arg("key_zps", optional=True, dtypes=QUANTIZED_TYPES),
        Arg("value_scales", optional=True, dtypes=FLOAT_DTYPES),
        Arg("value_zps", optional=True, dtypes=QUANTIZED_TYPES),
        Arg("dst", output=True, dtypes=OPERAND_DTYPES),
        Arg("stats", output=True, optional=True, dtypes=("f32",)),
    )

    def __attrs_post_init__(self) -> None:
        for name in ("query", "key", "value"):
            md = getattr(self, name)
            if md.ndims < 2:
                raise InvalidArgumentError(f"{name} dims {md.dims} need at least 2 dimensions (rows, head size)")
        (sq, d), (skv, dk), (skv_v, dv) = self.query.dims[-2:], self.key.dims[-2:], self.value.dims[-2:]
        self._check_quantization()
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
        if self.select_mask is not None:
            cond_dims = (1,) * max(0, 2 - self.select_mask.ndims) + self.select_mask.dims
            if cond_dims[-2] not in (1, sq) or cond_dims[-1] not in (1, skv):
                raise ArgumentMismatchError(
                    f"select_mask dims {self.select_mask.dims} do not broadcast to the scores' (Sq, Skv) = ({sq}, {skv})"
                )
            batches["select_mask"] = cond_dims[:-2]
            if self.fill is None:
                raise InvalidArgumentError("select_mask needs a fill value (fill=...)")
        elif self.fill is not None and self.causal is None:
            raise InvalidArgumentError("fill replaces masked scores: it needs select_mask or causal")
        if (self.causal_add is not None or self.causal_sub is not None) and self.causal != "bottom_right":
            raise InvalidArgumentError(
                f"causal_add/causal_sub give a bottom-right causal mask's offset at run time; causal is {self.causal!r}"
            )
        for name in ("softcap", "fill", "causal_add", "causal_sub"):
            md = getattr(self, name)
            if md is not None and md.nelems != 1:
                raise ArgumentMismatchError(f"{name} dims {md.dims} hold {md.nelems} elements; expected one")
        if self.fill_before_scale and self.scale is not None and self.softcap is not None:
            raise InvalidArgumentError(
                "fill_before_scale with softcap: the fill would go through tanh, which the kernel does not do"
            )
        if self.fill_before_scale and self.scale is not None and self.select_mask is None:
            raise InvalidArgumentError("fill_before_scale applies to select_mask's fill; there is no select_mask")
        try:
            batch = broadcast_dims(*batches.values())
        except ValueError:
            of = ", ".join(f"{name} {dims}" for name, dims in batches.items())
            raise ArgumentMismatchError(f"batch dims of {of} do not broadcast") from None
        if self.scale is None:
            self._set("scale_mode", "multiply")  # no scale: one descriptor either way
            self._set("fill_before_scale", False)
        elif self.scale.nelems != 1:
            raise ArgumentMismatchError(f"scale dims {self.scale.dims} hold {self.scale.nelems} elements; expected one")
        dims = batch + (sq, dv)
        if self.dst is None:
            dtype = self.dst_quant.dtype if self.dst_quant is not None else (
                self.query.dtype if self.query.dtype in FLOAT_DTYPES else "f32")
            self._set("dst", MemoryDesc(dims, dtype))
        check_memory_desc("dst", self.dst)
        if self.dst_quant is None and self.dst.dtype in QUANTIZED_TYPES:
            raise InvalidArgumentError(f"dst has the quantized dtype {self.dst.dtype!r}: it needs dst_quant=Quantization(...)")
        if self.dst_quant is not None and self.dst_quant.dtype != self.dst.dtype:
            raise ArgumentMismatchError(f"dst has dtype {self.dst.dtype!r} but dst_quant is for {self.dst_quant.dtype!r}")
        if self.dst.dims != dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from the attention output dims {dims} "
                f"(broadcast batch, Sq of query, Dv of value)"
            )
        if self.stats is not None:
            check_memory_desc("stats", self.stats)
            if self.stats.dims != batch + (sq, 1):
                raise ArgumentMismatchError(
                    f"stats dims {self.stats.dims} differ from the per-row statistics dims {batch + (sq, 1)}"
                )

    def _check_quantization(self) -> None:
        """A quantized operand has its Quantization and its Quantization names its dtype; grouped
        scales (and zero points) are shaped as the operand divided by the group."""
        for name in _QUANT_OPERANDS:
            md, quant = getattr(self, name), getattr(self, f"{name}_quant")
            if quant is None:
                if md.dtype in QUANTIZED_TYPES:
                    raise InvalidArgumentError(
                        f"{name} has the quantized dtype {md.dtype!r}: it needs {name}_quant=Quantization(...)")
                for part in ("scales", "zps"):
                    if getattr(self, f"{name}_{part}", None) is not None:
                        raise InvalidArgumentError(f"{name}_{part} belong to a grouped {name}_quant; there is none")
                continue
            if quant.dtype != md.dtype:
                raise ArgumentMismatchError(f"{name} has dtype {md.dtype!r} but {name}_quant is for {quant.dtype!r}")
            if not quant.grouped:
                for part in ("scales", "zps"):
                    if getattr(self, f"{name}_{part}", None) is not None:
                        raise InvalidArgumentError(f"{name}_{part} go with a grouped {name}_quant; it has a static scale")
                continue
            if name == "query":
                raise InvalidArgumentError("query_quant must be static (per tensor); grouped scales are for key and value")
            scales, zps = getattr(self, f"{name}_scales"), getattr(self, f"{name}_zps")
            if scales is None:
                raise InvalidArgumentError(f"a grouped {name}_quant needs its run-time {name}_scales")
            rows, cols = md.dims[-2:]
            gr, gc = quant.group
            if rows % gr or cols % gc:
                raise ArgumentMismatchError(
                    f"{name}_quant group {quant.group} does not divide {name}'s last dims ({rows}, {cols})")
            want = md.dims[:-2] + (rows // gr, cols // gc)
            for part, part_md in (("scales", scales), ("zps", zps)):
                if part_md is not None and part_md.dims != want:
                    raise ArgumentMismatchError(
                        f"{name}_{part} dims {part_md.dims} differ from {want} ({name} dims {md.dims} by group {quant.group})")
            if zps is not None and zps.dtype != md.dtype:
                raise ArgumentMismatchError(f"{name}_zps has dtype {zps.dtype!r}; {name} has {md.dtype!r}")
        if self.probs_quant is not None and self.probs_quant.grouped:
            raise InvalidArgumentError("probs_quant must be static (per tensor)")
        if self.dst_quant is not None and self.dst_quant.grouped:
            raise InvalidArgumentError("dst_quant must be static (per tensor)")

    @property
    def label(self) -> str:
        return "sdpa" if self.causal is None else f"sdpa:causal_{self.causal}"

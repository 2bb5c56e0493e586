"""The fused scaled-dot-product attention descriptor (oneDNN Graph's SDPA partitions)."""

from __future__ import annotations

import attrs

from ._values._errors import ArgumentMismatchError, InvalidArgumentError, UnsupportedError
from ._values._memory_desc import MemoryDesc
from ._primitive_desc import AnyStorage, _memory_desc
from .kernels import KernelConfig, KernelSpec
from .kernels import sdpa as sdpa_kernels


def _optional_memory_desc(name: str):
    def validate(instance, attribute, value) -> None:
        if value is not None:
            _memory_desc(name)(instance, attribute, value)

    return validate


def _one_of(name: str, allowed: tuple):
    def validate(instance, attribute, value) -> None:
        if value not in allowed:
            raise InvalidArgumentError(
                f"{name} {value!r} is not one of {', '.join(map(repr, allowed))}"
            )

    return validate


@attrs.frozen(cache_hash=True)
class SdpaDesc(AnyStorage):
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

    query: MemoryDesc = attrs.field(validator=_memory_desc("query"))
    key: MemoryDesc = attrs.field(validator=_memory_desc("key"))
    value: MemoryDesc = attrs.field(validator=_memory_desc("value"))
    dst: MemoryDesc = attrs.field(default=None)
    mask: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=_optional_memory_desc("mask"))
    scale: MemoryDesc | None = attrs.field(default=None, kw_only=True, validator=_optional_memory_desc("scale"))
    scale_mode: str = attrs.field(
        default="multiply", kw_only=True, validator=_one_of("scale_mode", sdpa_kernels.SCALE_MODES)
    )
    causal: str | None = attrs.field(
        default=None, kw_only=True, validator=_one_of("causal", (None,) + sdpa_kernels.CAUSAL)
    )

    kind = "sdpa"

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
            batch = sdpa_kernels.broadcast_batch(*batches.values())
        except ValueError:
            of = ", ".join(f"{name} {dims}" for name, dims in batches.items())
            raise ArgumentMismatchError(f"batch dims of {of} do not broadcast") from None
        if self.scale is None:
            object.__setattr__(self, "scale_mode", "multiply")  # no scale: one descriptor either way
        elif self.scale.nelems != 1:
            raise ArgumentMismatchError(f"scale dims {self.scale.dims} hold {self.scale.nelems} elements; expected one")
        dims = batch + (sq, dv)
        if self.dst is None:
            object.__setattr__(self, "dst", MemoryDesc(dims, self.query.dtype))
        _memory_desc("dst")(self, None, self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from the attention output dims {dims} "
                f"(broadcast batch, Sq of query, Dv of value)"
            )

    def check_supported(self) -> None:
        for name, desc in self.arg_descs.items():
            if desc.dtype not in sdpa_kernels.FLOAT_DTYPES:
                raise UnsupportedError(
                    f"sdpa: {name} has dtype {desc.dtype!r}; supported: {', '.join(sdpa_kernels.FLOAT_DTYPES)}"
                )

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        descs = {"query": self.query, "key": self.key, "value": self.value}
        if self.scale is not None:
            descs["scale"] = self.scale
        if self.mask is not None:
            descs["mask"] = self.mask
        descs["dst"] = self.dst
        return descs

    @property
    def label(self) -> str:
        return "sdpa" if self.causal is None else f"sdpa:causal_{self.causal}"

    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return sdpa_kernels.generate(
            q_dims=self.query.dims,
            q_strides=self.query.strides,
            k_dims=self.key.dims,
            k_strides=self.key.strides,
            v_dims=self.value.dims,
            v_strides=self.value.strides,
            dst_strides=self.dst.strides,
            mask_dims=None if self.mask is None else self.mask.dims,
            mask_strides=None if self.mask is None else self.mask.strides,
            has_scale=self.scale is not None,
            scale_mode=self.scale_mode,
            causal=self.causal,
            config=config,
            dtypes={name: desc.dtype for name, desc in self.arg_descs.items()},
        )


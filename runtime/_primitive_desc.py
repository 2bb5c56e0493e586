"""Operation descriptors: what a primitive computes, as a value (and later, a cache key part)."""

from __future__ import annotations

import math

import attrs

from ._values._errors import ArgumentMismatchError, InvalidArgumentError, UnsupportedError
from ._values._memory_desc import MemoryDesc
from . import _post_op_chain
from .kernels import _dtype_io
from .kernels import _post_ops as post_op_kernels
from .kernels import KernelConfig, KernelSpec
from .kernels import binary as binary_kernels
from .kernels import eltwise as eltwise_kernels


def _memory_desc(name: str):
    def validate(instance, attribute, value) -> None:
        if not isinstance(value, MemoryDesc):
            raise InvalidArgumentError(f"{name} is {type(value).__name__}, expected triodnn.MemoryDesc")

    return validate


def _finite_float(name: str):
    def convert(value) -> float:
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{name} {value!r} is not a number") from None
        if not math.isfinite(result):
            raise InvalidArgumentError(f"{name} {value!r} must be finite")
        return result

    return convert


class _Omitted:
    """An alpha or beta not given: the descriptor resolves it to the algorithm's default once the
    algorithm is known. Not None, which stays an invalid value rather than a silent default."""

    def __repr__(self) -> str:
        return "<algorithm default>"


_OMITTED = _Omitted()


def _parameter(name: str):
    """``_finite_float``, letting ``_OMITTED`` through for ``__attrs_post_init__`` to resolve."""
    convert_float = _finite_float(name)

    def convert(value):
        return value if value is _OMITTED else convert_float(value)

    return convert


def _float_key(value: float) -> tuple[float, bool]:
    """Equality and hash key of a float parameter: -0.0 and 0.0 bake different kernel literals
    (x * alpha keeps the sign of zero), so they are different descriptors."""
    return (value, math.copysign(1.0, value) < 0)


def _require_f32(kind: str, descs: dict[str, MemoryDesc]) -> None:
    for name, desc in descs.items():
        if desc.dtype != "f32":
            raise UnsupportedError(
                f"{kind}: {name} has dtype {desc.dtype!r}; this version computes f32 only"
            )


class F32Only:
    """Base of descriptors whose kernels compute f32 only: every argument must be f32.

    ``Engine.create_primitive`` calls ``check_supported`` before touching the cache, so an
    unsupported request leaves nothing behind.
    """

    __slots__ = ()

    def check_supported(self) -> None:
        _require_f32(self.kind, self.arg_descs)


class AnyStorage:
    """Base of descriptors whose kernels compute in f32 over any storage type (oneDNN's "f32 math,
    any storage" for eltwise, binary, sum and concat): each argument may independently be any
    data type of ``kernels._dtype_io.DTYPES``. f16 storage needs no cl_khr_fp16 (kernels touch it
    only through the core vload_half/vstore_half), so it is accepted on every device.

    Binary post-op operands stay f32: the post-op code reads them through float pointers.
    ``Engine.create_primitive`` calls ``check_supported`` before touching the cache, so an
    unsupported request leaves nothing behind.
    """

    __slots__ = ()

    def check_supported(self) -> None:
        chain = getattr(self, "post_ops", ())  # sum and concat take none
        operands = post_op_kernels.operands(chain)
        for i, op in enumerate(chain):
            if op[0] == "binary" and op[2].dtype != "f32":
                raise UnsupportedError(
                    f"{self.kind}: post_ops[{i}] binary operand {post_op_kernels.operand_name(i)} has "
                    f"dtype {op[2].dtype!r}; post-op operands are f32 only"
                )
        for name, desc in self.arg_descs.items():
            if name not in operands and desc.dtype not in _dtype_io.DTYPES:
                raise UnsupportedError(
                    f"{self.kind}: {name} has dtype {desc.dtype!r}; supported: {', '.join(_dtype_io.DTYPES)}"
                )


@attrs.frozen(cache_hash=True)
class EltwiseDesc(AnyStorage):
    """``dst = alg(src)`` elementwise. ``dst`` defaults to ``src`` (same dims, layout and data
    type). ``src`` and ``dst`` may each have any data type (``AnyStorage``); the math is f32.

    An omitted ``alpha``/``beta`` takes oneDNN's value for the algorithm where it has one
    (hardswish 1/6 and 1/2, soft_relu alpha 1) and 0 otherwise; the descriptor holds the resolved
    number, so an explicit default and an omitted one are the same primitive.
    """

    alg: str = attrs.field()
    src: MemoryDesc = attrs.field(validator=_memory_desc("src"))
    dst: MemoryDesc = attrs.field(default=None)
    alpha: float = attrs.field(default=_OMITTED, converter=_parameter("alpha"), eq=_float_key)
    beta: float = attrs.field(default=_OMITTED, converter=_parameter("beta"), eq=_float_key)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_op_chain.eq_key)

    kind = "eltwise"

    @alg.validator
    def _check_alg(self, attribute, value) -> None:
        if value not in eltwise_kernels.ALGORITHMS:
            raise InvalidArgumentError(
                f"alg {value!r} is not an eltwise algorithm; known: "
                f"{', '.join(eltwise_kernels.ALGORITHMS)}"
            )

    def __attrs_post_init__(self) -> None:
        alpha, beta = eltwise_kernels.parameters(
            self.alg,
            None if self.alpha is _OMITTED else self.alpha,
            None if self.beta is _OMITTED else self.beta,
        )
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "beta", beta)
        if self.dst is None:
            object.__setattr__(self, "dst", self.src)
        _memory_desc("dst")(self, None, self.dst)
        if self.dst.dims != self.src.dims:
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from src dims {self.src.dims}"
            )
        if self.alg == "clip" and self.alpha > self.beta:
            raise InvalidArgumentError(f"clip needs alpha <= beta, got alpha={self.alpha} beta={self.beta}")
        if self.alg in eltwise_kernels.NONZERO_ALPHA and self.alpha == 0.0:
            raise InvalidArgumentError(
                f"{self.alg} divides by alpha: alpha must be nonzero, got {self.alpha}"
            )
        object.__setattr__(self, "post_ops", _post_op_chain.check(self.post_ops, self.dst.dims))

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        return {"src": self.src, **post_op_kernels.operands(self.post_ops), "dst": self.dst}

    @property
    def label(self) -> str:
        return f"eltwise:{self.alg}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return eltwise_kernels.generate(
            self.alg,
            dims=self.src.dims,
            src_strides=self.src.strides,
            dst_strides=self.dst.strides,
            alpha=self.alpha,
            beta=self.beta,
            config=config,
            post_ops=self.post_ops,
            src_dtype=self.src.dtype,
            dst_dtype=self.dst.dtype,
        )


@attrs.frozen(cache_hash=True)
class BinaryDesc(AnyStorage):
    """``dst = alg(src0, src1)`` with numpy broadcasting; ``dst`` defaults to the dense broadcast shape.

    ``select`` (oneDNN's binary_select, ``dst = src2 ? src0 : src1``) takes its condition as the
    keyword ``src2``, broadcast like the sources; the other algorithms refuse one. Keyword-only so
    that ``BinaryDesc(alg, src0, src1, dst)`` keeps its meaning.

    Every argument may have any data type (``AnyStorage``), the math f32: a comparison writes 1 or
    0 into a dst of any type (``boolean`` included), select's condition may be boolean, u8, s32 or
    f32. ``dst`` defaults to src0's data type.
    """

    alg: str = attrs.field()
    src0: MemoryDesc = attrs.field(validator=_memory_desc("src0"))
    src1: MemoryDesc = attrs.field(validator=_memory_desc("src1"))
    dst: MemoryDesc = attrs.field(default=None)
    src2: MemoryDesc | None = attrs.field(default=None, kw_only=True)
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_op_chain.eq_key)

    kind = "binary"

    @alg.validator
    def _check_alg(self, attribute, value) -> None:
        if value not in binary_kernels.ALGORITHMS:
            raise InvalidArgumentError(
                f"alg {value!r} is not a binary algorithm; known: {', '.join(binary_kernels.ALGORITHMS)}"
            )

    def __attrs_post_init__(self) -> None:
        sources = {"src0": self.src0, "src1": self.src1}
        if self.alg in binary_kernels.TERNARY:
            if self.src2 is None:
                raise ArgumentMismatchError(f"{self.alg} needs src2, the condition")
            _memory_desc("src2")(self, None, self.src2)
            sources["src2"] = self.src2
        elif self.src2 is not None:
            raise ArgumentMismatchError(
                f"{self.alg} takes no src2 (only {', '.join(sorted(binary_kernels.TERNARY))} does)"
            )
        try:
            dims = binary_kernels.broadcast_dims(*(md.dims for md in sources.values()))
        except ValueError:
            shapes = " and ".join(f"{name} dims {md.dims}" for name, md in sources.items())
            raise ArgumentMismatchError(f"{shapes} do not broadcast") from None
        if self.dst is None:
            object.__setattr__(self, "dst", MemoryDesc(dims, self.src0.dtype))
        _memory_desc("dst")(self, None, self.dst)
        if self.dst.dims != dims:
            of = " and ".join(f"{name} {md.dims}" for name, md in sources.items())
            raise ArgumentMismatchError(
                f"dst dims {self.dst.dims} differ from the broadcast of {of}, which is {dims}"
            )
        object.__setattr__(self, "post_ops", _post_op_chain.check(self.post_ops, self.dst.dims))

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        descs = {"src0": self.src0, "src1": self.src1}
        if self.src2 is not None:
            descs["src2"] = self.src2
        return {**descs, **post_op_kernels.operands(self.post_ops), "dst": self.dst}

    @property
    def label(self) -> str:
        return f"binary:{self.alg}"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return binary_kernels.generate(
            self.alg,
            src0_dims=self.src0.dims,
            src0_strides=self.src0.strides,
            src1_dims=self.src1.dims,
            src1_strides=self.src1.strides,
            src2_dims=None if self.src2 is None else self.src2.dims,
            src2_strides=None if self.src2 is None else self.src2.strides,
            dst_strides=self.dst.strides,
            config=config,
            post_ops=self.post_ops,
            src0_dtype=self.src0.dtype,
            src1_dtype=self.src1.dtype,
            src2_dtype="f32" if self.src2 is None else self.src2.dtype,
            dst_dtype=self.dst.dtype,
        )

"""Logical tensors: the id, data type, shape and layout of a graph edge, as a value.

oneDNN Graph describes every edge of a graph by a logical tensor. Shapes may be partly unknown
until compilation (``-1`` per unknown dim, ``None`` for an unknown rank); the layout may be
``undef`` (not said), ``any`` (the library chooses at compilation), ``strided`` (explicit
strides) or ``opaque`` (a library layout named by ``layout_id``, which only later partitions of
the same library understand).
"""

from __future__ import annotations

import math
import operator

import attrs

from .._values._dtypes import DATA_TYPES
from .._values._errors import InvalidArgumentError
from .._values._int4 import PACKED, packed_nbytes
from .._values._memory_desc import MemoryDesc

UNKNOWN_DIM = -1
# oneDNN serialises an unknown dim (DNNL_GRAPH_UNKNOWN_DIM) as INT64_MIN.
_ONEDNN_UNKNOWN_DIM = -(2**63)

LAYOUT_TYPES = ("undef", "any", "strided", "opaque")
# ``host_scalar``: a 0-D or one-element input whose value the host passes at each execution
# (oneDNN's ``tensor::make_scalar_tensor``: attention scales, causal-mask offsets, dropout
# probability). triodnn computes on it like any input; ``CompiledPartition.execute`` accepts a
# Python or numpy number for it and writes it into a small device buffer per execution.
PROPERTY_TYPES = ("undef", "variable", "constant", "host_scalar")

# "boolean" is oneDNN Graph's one-byte truth type; the others are triodnn's data types.
GRAPH_DTYPES = tuple(dict.fromkeys((*DATA_TYPES, "boolean")))
_ITEMSIZE = {**{name: info.itemsize for name, info in DATA_TYPES.items()}, "boolean": 1}


def _integer(name: str, value) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} {value!r} must be an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} {value!r} must be an integer") from None


def _to_shape(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        dims = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"shape {value!r} is not a sequence of integers") from None
    dims = tuple(_integer("shape entry", d) for d in dims)
    dims = tuple(UNKNOWN_DIM if d == _ONEDNN_UNKNOWN_DIM else d for d in dims)
    for d in dims:
        if d < UNKNOWN_DIM:
            raise InvalidArgumentError(f"shape {list(dims)} has a negative dim {d} (-1 means unknown)")
    return dims


def _to_strides(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        strides = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"strides {value!r} is not a sequence of integers") from None
    strides = tuple(_integer("stride", s) for s in strides)
    return tuple(UNKNOWN_DIM if s == _ONEDNN_UNKNOWN_DIM else s for s in strides)


def dense_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


@attrs.frozen(cache_hash=True)
class LogicalTensor:
    """One graph edge: ``id``, ``dtype``, ``shape`` (None: unknown rank; -1: unknown dim),
    ``strides`` (for ``strided``), ``layout_type``, ``layout_id`` (for ``opaque``) and
    ``property_type`` (``constant`` tensors keep their values between executions).

    A strided tensor with a known shape and no strides gets dense row-major strides, so the
    two spellings are one value.
    """

    id: int = attrs.field(converter=lambda v: _integer("logical tensor id", v))
    dtype: str = attrs.field(default="f32")
    shape: tuple[int, ...] | None = attrs.field(default=None, converter=_to_shape)
    strides: tuple[int, ...] | None = attrs.field(default=None, converter=_to_strides)
    layout_type: str = attrs.field(default=None)
    layout_id: int | None = attrs.field(default=None)
    property_type: str = attrs.field(default="undef")

    def __attrs_post_init__(self) -> None:
        if self.id < 0:
            raise InvalidArgumentError(f"logical tensor id {self.id} must be >= 0")
        if self.dtype not in GRAPH_DTYPES:
            raise InvalidArgumentError(
                f"logical tensor {self.id}: dtype {self.dtype!r} is not supported; "
                f"known: {', '.join(GRAPH_DTYPES)}"
            )
        layout = self.layout_type
        if layout is None:
            layout = "strided" if self.strides is not None else "undef"
            object.__setattr__(self, "layout_type", layout)
        if layout not in LAYOUT_TYPES:
            raise InvalidArgumentError(
                f"logical tensor {self.id}: layout_type {layout!r} is not one of {', '.join(LAYOUT_TYPES)}"
            )
        if self.property_type not in PROPERTY_TYPES:
            raise InvalidArgumentError(
                f"logical tensor {self.id}: property_type {self.property_type!r} is not one of "
                f"{', '.join(PROPERTY_TYPES)}"
            )
        if (self.property_type == "host_scalar" and self.shape is not None
                and any(d not in (1, UNKNOWN_DIM) for d in self.shape)):
            raise InvalidArgumentError(
                f"logical tensor {self.id}: a host_scalar holds one value; its shape "
                f"{list(self.shape)} must be [] or all ones"
            )
        if layout == "opaque":
            if self.layout_id is None:
                raise InvalidArgumentError(f"logical tensor {self.id}: an opaque layout needs a layout_id")
            object.__setattr__(self, "layout_id", _integer("layout_id", self.layout_id))
        if layout == "strided":
            # oneDNN writes unknown strides as INT64_MIN; with a known shape they are dense.
            if (self.strides is None or UNKNOWN_DIM in self.strides) and self.is_shape_known:
                object.__setattr__(self, "strides", dense_strides(known_shape(self)))
            if (self.shape is not None and self.strides is not None
                    and len(self.strides) != len(self.shape)):
                raise InvalidArgumentError(
                    f"logical tensor {self.id}: strides {list(self.strides)} and shape "
                    f"{list(self.shape)} have different lengths"
                )

    @property
    def ndims(self) -> int:
        """Number of dims, -1 when the rank is unknown."""
        return -1 if self.shape is None else len(self.shape)

    @property
    def is_shape_known(self) -> bool:
        return self.shape is not None and UNKNOWN_DIM not in self.shape

    @property
    def nbytes(self) -> int:
        """Bytes a buffer for this tensor needs (oneDNN's ``get_mem_size``); 0 while unknown."""
        if not self.is_shape_known:
            return 0
        shape = known_shape(self)
        if any(d == 0 for d in shape):
            return 0
        strides = self.strides if self.layout_type == "strided" and self.strides else dense_strides(shape)
        span = 1 + sum((d - 1) * abs(s) for d, s in zip(shape, strides))
        if self.dtype in PACKED:  # s4/u4: two a byte, in whole words (MemoryDesc.nbytes)
            return packed_nbytes(span)
        return span * _ITEMSIZE[self.dtype]

    @property
    def is_empty(self) -> bool:
        """A known shape with a 0 dim: no elements (an empty batch, a K of 0)."""
        return self.is_shape_known and 0 in known_shape(self)

    @property
    def numel(self) -> int:
        return math.prod(known_shape(self)) if self.is_shape_known else 0

    def has_same_layout_and_dtype(self, other: LogicalTensor) -> bool:
        return (
            self.dtype == other.dtype
            and self.layout_type == other.layout_type
            and (self.layout_type != "strided" or self.strides == other.strides)
            and (self.layout_type != "opaque" or self.layout_id == other.layout_id)
        )

    def evolve(self, **changes) -> LogicalTensor:
        return attrs.evolve(self, **changes)

    def memory_desc(self, strides: tuple[int, ...] | None = None) -> MemoryDesc:
        """The MemoryDesc of this tensor (0-D becomes (1,)), with ``strides`` if given.

        An empty tensor (a 0 dim) gets a one-element placeholder of its rank: OpenCL refuses
        0-byte buffers and triodnn's descriptors have positive dims. Nothing reads or writes
        it (compilation lowers no step on empty work; ``Tensor`` reads back an empty array)."""
        if not self.is_shape_known:
            raise InvalidArgumentError(f"logical tensor {self.id} has no known shape {self.shape}")
        if self.is_empty:
            dims = (1,) * len(known_shape(self))
            return MemoryDesc(dims, storage_dtype(self.dtype), dense_strides(dims))
        dims = self.shape or (1,)
        if strides is None:
            strides = self.strides if self.layout_type == "strided" and self.strides else dense_strides(dims)
        if not self.shape:
            strides = (1,)
        return MemoryDesc(dims, storage_dtype(self.dtype), strides)


def known_shape(lt: LogicalTensor) -> tuple[int, ...]:
    """``lt.shape`` where the rank is known by construction: ports a compile checked, shapes it
    inferred, tensors bound to memory. ``TypeError`` (what using None as a shape raised) if not."""
    if lt.shape is None:
        raise TypeError(f"logical tensor {lt.id} has an unknown rank here")
    return lt.shape


def storage_dtype(dtype: str) -> str:
    """The triodnn memory dtype holding a graph dtype (boolean is one byte)."""
    if dtype in DATA_TYPES:
        return dtype
    return "u8"

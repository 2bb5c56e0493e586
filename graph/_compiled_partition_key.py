"""The compiled-partition cache key: what a ``CompiledPartition`` depends on, as a value.

Two compiles with equal keys give interchangeable compiled partitions: the same ops (id, kind,
normalised attributes, input and output logical tensors, in partition order), the same input and
output logical tensors after layout resolution (shapes, dtypes, strides, layout ids), the same
engine (``EngineIdentity``: device and OpenCL context, since a compiled partition holds
engine-bound primitives) and the same fpmath mode. Op names are labels and stay out.

Attribute values are tagged with their type and floats spelled exactly (``float.hex``), so
``True`` and ``1``, ``1`` and ``1.0``, ``0.0`` and ``-0.0`` are different keys, a NaN key equals
itself, and a list equals the tuple of its items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .._engine import Engine
from .._values._keys import EngineIdentity
from ._logical_tensor import LogicalTensor
from ._op import Op

if TYPE_CHECKING:
    # Annotations only: partitions compile through the cache, which builds keys of them.
    from ._partition import Partition


def normalise_attr(value) -> tuple:
    """An attribute value as a hashable, type-tagged, exactly comparable tuple."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        return ("float", float(value).hex())
    if isinstance(value, str):
        return ("str", value)
    if value is None:
        return ("none",)
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(normalise_attr(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__qualname__, repr(value))
    return ("value", type(value).__qualname__, value)


def op_signature(op: Op) -> tuple:
    """``(id, kind, attrs, inputs, outputs)`` of ``op``, attrs sorted by name and normalised."""
    attributes = tuple(sorted((name, normalise_attr(value)) for name, value in op.attrs.items()))
    return (op.id, op.kind, attributes, tuple(op.inputs), tuple(op.outputs))


@attrs.frozen(cache_hash=True)
class CompiledPartitionKey:
    """The compiled-partition cache's key; ``CompiledPartitionKey.of(...)`` builds one."""

    ops: tuple[tuple, ...]
    inputs: tuple[LogicalTensor, ...]
    outputs: tuple[LogicalTensor, ...]
    engine: EngineIdentity
    fpmath_mode: str

    @classmethod
    def of(cls, partition: Partition, engine: Engine, inputs, outputs) -> CompiledPartitionKey:
        """The key of compiling ``partition`` on ``engine`` with the resolved ``inputs`` and
        ``outputs`` (port order)."""
        return cls(
            ops=tuple(op_signature(op) for op in partition.ops),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            engine=engine.identity,
            fpmath_mode=partition.fpmath_mode,
        )

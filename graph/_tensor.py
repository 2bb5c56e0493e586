"""Tensors: a logical tensor bound to memory on an engine, what compiled partitions execute on."""

from __future__ import annotations

import attrs
import numpy as np

from .._engine import Engine
from .._memory import Memory
from .._portal_route import portal_of
from .._values._dtypes import from_storage
from .._values._errors import ArgumentMismatchError, InvalidArgumentError
from ._logical_tensor import LogicalTensor, known_shape


@attrs.define(eq=False)
class Tensor:
    """``Tensor(logical_tensor, engine)`` allocates; ``Tensor(lt, engine, memory)`` wraps a Memory
    whose descriptor must be the logical tensor's."""

    logical_tensor: LogicalTensor
    engine: Engine
    memory: Memory = attrs.field(default=None)  # None: allocated for the logical tensor

    def __attrs_post_init__(self) -> None:
        lt = self.logical_tensor
        if not isinstance(lt, LogicalTensor):
            raise InvalidArgumentError(f"logical_tensor is {type(lt).__name__}, expected LogicalTensor")
        desc = lt.memory_desc()
        if self.memory is None:
            self.memory = self.engine.memory(desc)
        elif self.memory.desc != desc:
            raise ArgumentMismatchError(
                f"memory {self.memory.desc} does not match logical tensor {lt.id} ({desc})"
            )

    def release(self) -> None:
        """Free the tensor's memory now, as ``Memory.release`` does: commands already submitted
        on it still complete, and a tensor over a view frees nothing (the viewed memory owns the
        buffer). A tensor made over a Memory of yours releases that Memory."""
        self.memory.release()

    @property
    def released(self) -> bool:
        return self.memory.released

    def __enter__(self) -> Tensor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    @classmethod
    def from_numpy(cls, lt: LogicalTensor, engine: Engine, array):
        """A new tensor of ``lt`` on ``engine`` holding ``array``, converted by the input
        policy (docs/runtime.md, Inputs): ``await Tensor.from_numpy(...)``; with an engine of a blocking
        portal it is made there and comes back wrapped."""
        portal = portal_of(engine)
        if portal is not None:
            return portal.run(cls._from_numpy, lt, engine, array)
        return cls._from_numpy(lt, engine, array)

    @classmethod
    async def _from_numpy(cls, lt: LogicalTensor, engine: Engine, array) -> Tensor:
        tensor = cls(lt, engine)
        try:
            await tensor.write(array)
        except BaseException:
            tensor.release()   # a refused array leaves no buffer behind
            raise
        return tensor

    async def write(self, array) -> None:
        array = np.asarray(array)
        shape = known_shape(self.logical_tensor)  # it has memory, so a known shape
        if array.shape != tuple(shape):
            raise ArgumentMismatchError(
                f"array shape {array.shape} differs from logical tensor {self.logical_tensor.id} "
                f"shape {tuple(shape)}"
            )
        if self.logical_tensor.is_empty:
            return  # nothing to copy: the memory is a placeholder (LogicalTensor.memory_desc)
        await self.memory.write(array.reshape(self.memory.desc.dims))

    async def to_numpy(self, *, deps=()) -> np.ndarray:
        if self.logical_tensor.is_empty:
            desc = self.memory.desc
            values = from_storage(np.empty(known_shape(self.logical_tensor), desc.numpy_dtype), desc.dtype)
            return values.astype(bool) if self.logical_tensor.dtype == "boolean" else values
        values = await self.memory.to_numpy(deps=deps)
        values = values.reshape(self.logical_tensor.shape)
        if self.logical_tensor.dtype == "boolean":
            values = values.astype(bool)
        return values

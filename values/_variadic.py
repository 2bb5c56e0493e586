"""Variadic sources, as sum and concat take them: a tuple of MemoryDesc executing as ``src0`` ..
``src{N-1}``."""

from __future__ import annotations

from ._errors import InvalidArgumentError
from ._memory_desc import MemoryDesc
from ._op_desc import check_memory_desc

# Most sources a sum or concat takes: each is one kernel parameter.
MAX_INPUTS = 64


def to_srcs(value) -> tuple[MemoryDesc, ...]:
    """An attrs converter: ``value`` as a tuple of 1 to ``MAX_INPUTS`` MemoryDesc (a list is
    accepted and stored as a tuple, so the descriptor stays a hashable cache key);
    ``InvalidArgumentError`` naming ``srcs`` or ``srcs[i]`` otherwise."""
    if isinstance(value, (MemoryDesc, str, bytes)) or value is None:
        raise InvalidArgumentError(
            f"srcs is {type(value).__name__}, expected a tuple of triodnn.MemoryDesc"
        )
    try:
        srcs = tuple(value)
    except TypeError:
        raise InvalidArgumentError(
            f"srcs is {type(value).__name__}, expected a tuple of triodnn.MemoryDesc"
        ) from None
    if not 1 <= len(srcs) <= MAX_INPUTS:
        raise InvalidArgumentError(f"srcs has {len(srcs)} inputs; 1 to {MAX_INPUTS} are supported")
    for i, md in enumerate(srcs):
        check_memory_desc(f"srcs[{i}]", md)
    return srcs

"""Layout resolution at compilation: what ``undef``, ``any`` and ``opaque`` tensors become.

triodnn's one opaque layout is dense row-major, ``layout_id`` ``ROW_MAJOR``: its kernels read
any strides, so the layout a producer picks for ``any`` never needs a reorder before the next
partition, and the id only has to be recognised. An opaque tensor from another library (another
layout id) is refused by name.
"""

from __future__ import annotations

from .._values._errors import InvalidArgumentError
from ._logical_tensor import LogicalTensor, dense_strides

ROW_MAJOR = 0


def _check_opaque(lt: LogicalTensor) -> None:
    if lt.layout_type == "opaque" and lt.layout_id != ROW_MAJOR:
        raise InvalidArgumentError(
            f"logical tensor {lt.id} has opaque layout_id {lt.layout_id}, which triodnn did not "
            f"produce (its opaque layout id is {ROW_MAJOR})"
        )


def resolve_input_layout(lt: LogicalTensor) -> LogicalTensor:
    _check_opaque(lt)
    if lt.layout_type == "strided" and lt.strides is not None and -1 not in lt.strides:
        return lt
    if lt.shape is None:  # unknown rank, no strides to give: the caller's shape check refuses it
        return lt
    return lt.evolve(layout_type="strided", strides=dense_strides(lt.shape), layout_id=None)


def resolve_output_layout(lt: LogicalTensor, shape: tuple[int, ...]) -> LogicalTensor:
    """``lt`` with its inferred ``shape``: ``any`` becomes opaque row-major; ``undef`` and
    strided without strides become dense strided."""
    if lt.layout_type == "any":
        return lt.evolve(shape=shape, strides=None, layout_type="opaque", layout_id=ROW_MAJOR)
    if lt.layout_type == "opaque":
        _check_opaque(lt)  # its shape may still be unknown: only the layout id is checked
        return lt.evolve(shape=shape)
    if lt.layout_type == "strided" and lt.strides is not None and -1 not in lt.strides \
            and len(lt.strides) == len(shape):
        return lt.evolve(shape=shape)
    return lt.evolve(shape=shape, layout_type="strided", strides=dense_strides(shape))

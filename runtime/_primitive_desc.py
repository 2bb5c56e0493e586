"""Transitional re-exports (issue 15): EltwiseDesc and BinaryDesc live in ``triodnn._values``, and
the shared descriptor helpers in ``_values._op_desc`` / ``_values._numbers``. The descriptor
modules not yet moved import these names from here; the stub goes once they have moved."""

from __future__ import annotations

from ._values import _post_ops
from ._values._binary_desc import BinaryDesc as BinaryDesc
from ._values._dtypes import DATA_TYPES
from ._values._eltwise_desc import EltwiseDesc as EltwiseDesc
from ._values._eltwise_desc import parameter as _parameter
from ._values._errors import UnsupportedError
from ._values._numbers import finite_float as _finite_float
from ._values._numbers import float_key as _float_key
from ._values._op_desc import OMITTED as _OMITTED
from ._values._op_desc import memory_desc as _memory_desc

__all__ = [
    "AnyStorage", "BinaryDesc", "EltwiseDesc", "F32Only", "_OMITTED", "_finite_float", "_float_key",
    "_memory_desc", "_parameter", "_require_f32",
]


def _require_f32(kind: str, descs) -> None:
    for name, desc in descs.items():
        if desc.dtype != "f32":
            raise UnsupportedError(f"{kind}: {name} has dtype {desc.dtype!r}; this version computes f32 only")


class F32Only:
    """The old base of f32-only descriptors: every argument must be f32."""

    __slots__ = ()

    def check_supported(self) -> None:
        _require_f32(self.kind, self.arg_descs)


class AnyStorage:
    """The old base of "f32 math, any storage" descriptors that declare no ``ARGS`` yet: every
    argument of ``arg_descs`` any data type, binary post-op operands f32 (``OpDesc``'s rule)."""

    __slots__ = ()

    def check_supported(self) -> None:
        chain = getattr(self, "post_ops", ())  # sum and concat take none
        operands = _post_ops.operands(chain)
        for i, op in enumerate(chain):
            if op[0] == "binary" and op[2].dtype != "f32":
                raise UnsupportedError(
                    f"{self.kind}: post_ops[{i}] binary operand {_post_ops.operand_name(i)} has "
                    f"dtype {op[2].dtype!r}; post-op operands are f32 only"
                )
        for name, desc in self.arg_descs.items():
            if name not in operands and desc.dtype not in DATA_TYPES:
                raise UnsupportedError(
                    f"{self.kind}: {name} has dtype {desc.dtype!r}; supported: {', '.join(DATA_TYPES)}"
                )

"""The matmul operation descriptor, and the batch broadcasting it validates against."""

from __future__ import annotations

import attrs
import numpy as np

from . import _post_ops
from ._algorithms import broadcast_dims
from ._errors import ArgumentMismatchError, InvalidArgumentError
from ._fpmath import check_fpmath
from ._memory_desc import MemoryDesc
from ._op_desc import Arg, OpDesc, check_memory_desc, op_kind


@op_kind
@attrs.frozen(cache_hash=True)
class MatmulDesc(OpDesc):
    """``dst = src @ weights (+ bias)``, batched with numpy broadcasting of the batch dims.

    ``src``, ``weights``, ``bias`` and ``dst`` may each have any data type (f32 math, any
    storage, e.g. bf16 inputs with an f32 or bf16 dst, as attention graphs use); ``dst`` defaults
    to src's data type. Binary post-op operands are f32.

    ``src`` is (..., M, K), ``weights`` (..., K, N); ``dst`` defaults to the dense
    (batch..., M, N); ``bias`` is optional and broadcasts to ``dst`` (e.g. (1, N) or (M, 1)).
    Transposed or strided inputs are expressed by their strides. ``post_ops`` (keyword): a chain
    of ``("eltwise", alg, alpha, beta)``, ``("sum", scale)`` and ``("binary", alg, src1)`` applied
    to the result before the store (the forms docs/primitives.md lists under "Post-op chains"). ``output_scale``
    (keyword, finite, default 1): oneDNN v2's output scale, ``(src @ weights + bias) *
    output_scale``, applied before the post-op chain. ``fpmath`` (keyword, oneDNN's fpmath mode,
    default "strict"): the down-conversions f32 math may make; "tf32" or "any" lets f32 src and
    weights multiply as TF32 on NVIDIA tensor cores where a kernel does that.
    """

    src: MemoryDesc
    weights: MemoryDesc
    dst: MemoryDesc = attrs.field(default=None)
    bias: MemoryDesc | None = None
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_ops.eq_key)
    output_scale: float = _post_ops.output_scale_field()
    fpmath: str = attrs.field(default="strict", kw_only=True)

    kind = "matmul"
    ARGS = (Arg("src"), Arg("weights"), Arg("bias", optional=True), Arg("dst", output=True))

    def __attrs_post_init__(self) -> None:
        check_memory_desc("src", self.src)
        check_memory_desc("weights", self.weights)
        for name, md in (("src", self.src), ("weights", self.weights)):
            if md.ndims < 2:
                raise InvalidArgumentError(f"{name} dims {md.dims} need at least 2 dimensions (rows, columns)")
        (m, k), (k2, n) = self.src.dims[-2:], self.weights.dims[-2:]
        if k != k2:
            raise ArgumentMismatchError(
                f"src dims {self.src.dims} have K={k} but weights dims {self.weights.dims} have K={k2}"
            )
        try:
            batch = broadcast_dims(self.src.dims[:-2], self.weights.dims[:-2])
        except ValueError:
            raise ArgumentMismatchError(
                f"batch dims of src {self.src.dims[:-2]} and weights {self.weights.dims[:-2]} do not broadcast"
            ) from None
        dims = batch + (m, n)
        if self.dst is None:
            self._set("dst", MemoryDesc(dims, self.src.dtype))
        check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from src @ weights dims {dims}")
        if self.bias is not None:
            check_memory_desc("bias", self.bias)
            try:
                fits = self.bias.ndims <= len(dims) and np.broadcast_shapes(self.bias.dims, dims) == dims
            except ValueError:
                fits = False
            if not fits:
                raise ArgumentMismatchError(f"bias dims {self.bias.dims} do not broadcast to dst dims {dims}")
        self._set("post_ops", _post_ops.check(self.post_ops, dims))
        check_fpmath("fpmath", self.fpmath)

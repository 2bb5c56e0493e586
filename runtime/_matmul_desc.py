"""The matmul operation descriptor."""

from __future__ import annotations

import attrs
import numpy as np

from ._values._errors import ArgumentMismatchError, InvalidArgumentError
from ._values._memory_desc import MemoryDesc
from ._primitive_desc import AnyStorage
from . import _post_op_chain
from .kernels import _post_ops as post_op_kernels
from .kernels import KernelConfig, KernelSpec
from .kernels import matmul as matmul_kernels


def _check_memory_desc(name: str, value) -> None:
    if not isinstance(value, MemoryDesc):
        raise InvalidArgumentError(f"{name} is {type(value).__name__}, expected triodnn.MemoryDesc")


@attrs.frozen(cache_hash=True)
class MatmulDesc(AnyStorage):
    """``dst = src @ weights (+ bias)``, batched with numpy broadcasting of the batch dims.

    ``src``, ``weights``, ``bias`` and ``dst`` may each have any data type (``AnyStorage``; f32
    math, e.g. bf16 inputs with an f32 or bf16 dst, as attention graphs use); ``dst`` defaults to
    src's data type. Binary post-op operands are f32.

    ``src`` is (..., M, K), ``weights`` (..., K, N); ``dst`` defaults to the dense
    (batch..., M, N); ``bias`` is optional and broadcasts to ``dst`` (e.g. (1, N) or (M, 1)).
    Transposed or strided inputs are expressed by their strides. ``post_ops`` (keyword): a chain
    of ``("eltwise", alg, alpha, beta)``, ``("sum", scale)`` and ``("binary", alg, src1)`` applied
    to the result before the store (see ``triodnn._post_op_chain``). ``output_scale`` (keyword,
    finite, default 1): oneDNN v2's output scale, ``(src @ weights + bias) * output_scale``, applied
    before the post-op chain.
    """

    src: MemoryDesc
    weights: MemoryDesc
    dst: MemoryDesc = None
    bias: MemoryDesc | None = None
    post_ops: tuple = attrs.field(default=(), kw_only=True, eq=_post_op_chain.eq_key)
    output_scale: float = _post_op_chain.output_scale_field()

    kind = "matmul"

    def __attrs_post_init__(self) -> None:
        _check_memory_desc("src", self.src)
        _check_memory_desc("weights", self.weights)
        for name, md in (("src", self.src), ("weights", self.weights)):
            if md.ndims < 2:
                raise InvalidArgumentError(f"{name} dims {md.dims} need at least 2 dimensions (rows, columns)")
        (m, k), (k2, n) = self.src.dims[-2:], self.weights.dims[-2:]
        if k != k2:
            raise ArgumentMismatchError(
                f"src dims {self.src.dims} have K={k} but weights dims {self.weights.dims} have K={k2}"
            )
        try:
            batch = matmul_kernels.broadcast_batch(self.src.dims[:-2], self.weights.dims[:-2])
        except ValueError:
            raise ArgumentMismatchError(
                f"batch dims of src {self.src.dims[:-2]} and weights {self.weights.dims[:-2]} do not broadcast"
            ) from None
        dims = batch + (m, n)
        if self.dst is None:
            object.__setattr__(self, "dst", MemoryDesc(dims, self.src.dtype))
        _check_memory_desc("dst", self.dst)
        if self.dst.dims != dims:
            raise ArgumentMismatchError(f"dst dims {self.dst.dims} differ from src @ weights dims {dims}")
        if self.bias is not None:
            _check_memory_desc("bias", self.bias)
            try:
                fits = self.bias.ndims <= len(dims) and np.broadcast_shapes(self.bias.dims, dims) == dims
            except ValueError:
                fits = False
            if not fits:
                raise ArgumentMismatchError(f"bias dims {self.bias.dims} do not broadcast to dst dims {dims}")
        object.__setattr__(self, "post_ops", _post_op_chain.check(self.post_ops, dims))

    @property
    def arg_descs(self) -> dict[str, MemoryDesc]:
        descs = {"src": self.src, "weights": self.weights}
        if self.bias is not None:
            descs["bias"] = self.bias
        descs.update(post_op_kernels.operands(self.post_ops))
        descs["dst"] = self.dst
        return descs

    @property
    def label(self) -> str:
        return "matmul"


    def generate(self, config: KernelConfig) -> KernelSpec:
        self.check_supported()
        return _post_op_chain.generate_scaled(
            lambda chain: matmul_kernels.generate(
                src_dims=self.src.dims,
                src_strides=self.src.strides,
                wei_dims=self.weights.dims,
                wei_strides=self.weights.strides,
                dst_strides=self.dst.strides,
                bias_dims=None if self.bias is None else self.bias.dims,
                bias_strides=None if self.bias is None else self.bias.strides,
                config=config,
                post_ops=chain,
                src_dtype=self.src.dtype,
                wei_dtype=self.weights.dtype,
                bias_dtype="f32" if self.bias is None else self.bias.dtype,
                dst_dtype=self.dst.dtype,
            ),
            self.post_ops,
            self.output_scale,
        )

"""OpenCL C source generators and numpy references, one module per primitive kind.

Everything here is pure: plain values in, source text or numpy arrays out. No trio, no pyopencl
objects; the actors compile what these modules generate, and the tests compare against the
references.
"""

from . import (
    binary,
    concat,
    convolution,
    deconvolution,
    dynamic_quantize,
    eltwise,
    eltwise_bwd,
    gen_index,
    matmul,
    normalization,
    pooling,
    prelu,
    quantize,
    reduction,
    reorder,
    resampling,
    sdpa,
    softmax,
    sum,
    tolerance,
)
from ._float16_calls import program_source
from ._registry import KERNELS, KernelKind, generate, kind_of, register
from ._spec import KernelConfig, KernelSpec, c_float, dense_strides, is_dense, local_memory_bytes, select_config

__all__ = [
    "KERNELS",
    "KernelKind",
    "generate",
    "kind_of",
    "register",
    "KernelConfig",
    "KernelSpec",
    "binary",
    "c_float",
    "concat",
    "convolution",
    "deconvolution",
    "dense_strides",
    "dynamic_quantize",
    "eltwise",
    "eltwise_bwd",
    "gen_index",
    "is_dense",
    "local_memory_bytes",
    "matmul",
    "normalization",
    "pooling",
    "prelu",
    "program_source",
    "quantize",
    "reduction",
    "reorder",
    "resampling",
    "sdpa",
    "select_config",
    "softmax",
    "sum",
    "tolerance",
]

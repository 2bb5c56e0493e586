"""OpenCL C source generators and numpy references, one module per primitive kind.

Everything here is pure: plain values in, source text or numpy arrays out. No trio, no pyopencl
objects; the actors compile what these modules generate, and the tests compare against the
references.
"""

from . import (
    binary,
    concat,
    convolution,
    convolution_bwd_weights,
    deconvolution,
    dropout,  # Dropout (issue 21)
    dynamic_quantize,
    eltwise,
    eltwise_bwd,
    gen_index,
    matmul,
    normalization,
    normalization_bwd,
    pooling,
    pooling_bwd,
    prelu,
    prelu_bwd,
    quantize,
    reduction,
    reorder,
    resampling,
    sdpa,
    resampling_bwd,
    softmax,
    sum,
    softmax_bwd,
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
    "convolution_bwd_weights",
    "dense_strides",
    "dynamic_quantize",
    "dropout",  # Dropout (issue 21)
    "eltwise",
    "eltwise_bwd",
    "gen_index",
    "is_dense",
    "local_memory_bytes",
    "matmul",
    "normalization",
    "pooling",
    "normalization_bwd",
    "prelu",
    "pooling_bwd",
    "program_source",
    "prelu_bwd",
    "quantize",
    "reduction",
    "reorder",
    "resampling",
    "sdpa",
    "select_config",
    "resampling_bwd",
    "softmax",
    "sum",
    "tolerance",
    "softmax_bwd",
]

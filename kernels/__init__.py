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
    dequantizing_matmul,  # int4/int8 weights dequantized in the matmul
    dropout,  # Dropout with oneDNN's Philox mask
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
    quantized_matmul,  # int8 matmul
    reduction,
    reorder,
    resampling,
    resampling_bwd,
    sdpa,
    sdpa_backward,  # fused SDPA backward
    softmax,
    softmax_bwd,
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
    "convolution_bwd_weights",
    "deconvolution",
    "dense_strides",
    "dropout",  # Dropout with oneDNN's Philox mask
    "dynamic_quantize",
    "eltwise",
    "eltwise_bwd",
    "gen_index",
    "is_dense",
    "local_memory_bytes",
    "matmul",
    "normalization",
    "normalization_bwd",
    "pooling",
    "pooling_bwd",
    "prelu",
    "prelu_bwd",
    "program_source",
    "quantize",
    "quantized_matmul",  # int8 matmul
    "dequantizing_matmul",  # int4/int8 weights dequantized in the matmul
    "reduction",
    "reorder",
    "resampling",
    "resampling_bwd",
    "sdpa",
    "sdpa_backward",  # fused SDPA backward
    "select_config",
    "softmax",
    "softmax_bwd",
    "sum",
    "tolerance",
]

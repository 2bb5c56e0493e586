"""The GPU convolution kernel (kernels/convolution_gemm.py: implicit GEMM on the tiled SGEMM), run
on PoCL with the GPU kernel configuration forced (as test_matmul_gpu_kernel.py does).

Inputs are small integers, so every f32 sum is exact and results equal the float64 reference bit
for bit. Each case crosses several of the generator's branches at once (PoCL builds 256-item
work-groups slowly, so there are few cases): K order (channels outer for NCHW, inner for NHWC),
the float4 src gather (NHWC, channels a multiple of 4) and the element one, four NCHW positions
as one float4 (1x1) or four gathers, weights as a strided matrix or gathered, tile edges in M, N
and K, padding, strides, dilation, groups, 1D and 3D, bias, post-ops (sum, eltwise, a
per-channel binary operand) and the float4 dst stores (along channels for NHWC, along
positions for NCHW).
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_matmul import execute, gpu_shaped_fixture  # noqa: F401 (the gpu_shaped fixture)

from triodnn import MemoryDesc
from triodnn._values._convolution_desc import ConvolutionDesc
from triodnn.kernels import convolution, convolution_gemm, select_config


def ints(rng, shape) -> np.ndarray:
    return rng.integers(-3, 4, shape).astype(np.float32)


# name: src dims, src layout, weights dims, weights layout, strides, padding_l, padding_r, dilation,
# groups, bias, post-ops, dst layout, impl prefix
CASES = {
    # NCHW, OIHW (K channel-major, weights one stride), edges in M (198), N (20) and K (45).
    "nchw_bias_edges": ((2, 5, 9, 11), None, (20, 5, 3, 3), None, (1, 1), (1, 1), (1, 1), None, 1, True,
                        (), None, "ocl:implicit_gemm:ck:"),
    # NHWC, HWIO (K tap-major, float4 gathers, weights along N), stride 2, asymmetric padding,
    # sum + relu + a per-channel operand, float4 stores.
    "nhwc_wide_post_ops": ((2, 8, 12, 12), "nhwc", (32, 8, 3, 3), "hwio", (2, 2), (1, 0), (0, 1), None, 1,
                           False, ("sum", "relu", "per_channel"), "nhwc", "ocl:implicit_gemm:kc:"),
    # NHWC src, OIHW weights (gathered element by element), 2 groups, dilation.
    "nhwc_groups_gathered_weights": ((2, 8, 7, 9), "nhwc", (32, 4, 2, 3), None, (1, 1), (1, 2), (1, 2), (2, 1),
                                     2, True, (), None, "ocl:implicit_gemm:kc:"),
    # NCHW rows of 16 at stride 1: four positions of a row per gather.
    # (sum and a per-channel operand on dst stored four positions per float4)
    "nchw_rows": ((1, 4, 6, 16), None, (16, 4, 3, 3), None, (1, 1), (1, 1), (1, 1), None, 1, False,
                  ("sum", "per_channel"), None, "ocl:implicit_gemm:ck:"),
    # 1x1, stride 1, no padding, NCHW: four positions as one float4; K (12) under one slab.
    "nchw_pointwise": ((2, 12, 6, 6), None, (24, 12, 1, 1), None, (1, 1), (0, 0), (0, 0), None, 1, False,
                       (), None, "ocl:implicit_gemm:ck:"),
    # NHWC with 3 channels (conv1-like): channels inner, gathered element by element.
    # (OIHW weights: gathered element by element too.)
    "nhwc_odd_channels": ((2, 3, 10, 10), "nhwc", (16, 3, 3, 3), None, (1, 1), (1, 1), (1, 1), None, 1, True,
                          (), "nhwc", "ocl:implicit_gemm:kc:"),
    # NCHW rows of 8 at stride 2: four positions of a row, two src columns apart, per gather.
    "nchw_strided_rows": ((2, 8, 15, 15), None, (16, 8, 3, 3), None, (2, 2), (1, 1), (1, 1), None, 1,
                          True, ("relu",), None, "ocl:implicit_gemm:ck:"),
    # 3D and 1D, channels outer.
    "ncdhw": ((1, 3, 4, 5, 6), None, (16, 3, 2, 2, 2), None, (1, 1, 1), (1, 1, 1), (1, 1, 1), None, 1, False,
              (), None, "ocl:implicit_gemm:ck:"),
    "ncw_strided": ((4, 6, 60), None, (16, 6, 5), None, (3,), (2,), (0,), None, 1, True, ("relu",), None,
                    "ocl:implicit_gemm:ck:"),
}

LAYOUTS = {"nhwc": "nhwc", "hwio": "hwio", None: None}


def post_ops(names: tuple, oc: int, nsp: int) -> tuple:
    chain = {"sum": ("sum", 1.0), "relu": ("eltwise", "relu"),
             "per_channel": ("binary", "add", MemoryDesc((1, oc) + (1,) * nsp))}
    return tuple(chain[name] for name in names)


@pytest.mark.parametrize("case", list(CASES))
async def test_matches_reference_exactly(gpu_shaped, rng, case):
    (src_dims, src_layout, w_dims, w_layout, strides, pl, pr, dil, groups, bias, chain, dst_layout,
     impl) = CASES[case]
    nsp = len(src_dims) - 2
    desc = ConvolutionDesc(MemoryDesc(src_dims, strides=src_layout), MemoryDesc(w_dims, strides=w_layout),
                           None, MemoryDesc((w_dims[0],)) if bias else None, strides, pl, pr, dil, groups,
                           post_ops=post_ops(chain, w_dims[0], nsp))
    if dst_layout is not None:
        desc = ConvolutionDesc(desc.src, desc.weights, MemoryDesc(desc.dst.dims, strides=dst_layout), desc.bias,
                               strides, pl, pr, dil, groups, post_ops=desc.post_ops)
    arrays = {"src": ints(rng, src_dims), "weights": ints(rng, w_dims)}
    if bias:
        arrays["bias"] = ints(rng, (w_dims[0],))
    for i, op in enumerate(desc.post_ops):
        if op[0] == "binary":
            arrays[f"post_op_{i}_src1"] = ints(rng, op[2].dims)
    old = ints(rng, desc.dst.dims) if "sum" in chain else None
    primitive, got = await execute(gpu_shaped, desc, arrays, dst_init=old)
    assert primitive.impl.startswith(impl), primitive.impl
    want = convolution.desc_reference(desc, arrays | ({} if old is None else {"dst": old}))
    np.testing.assert_array_equal(got, want)


def test_few_channels_per_group_stay_direct():
    """Depthwise convolutions (one channel per group) and the CPU configuration keep the direct
    kernel; so do quantized ones (``applies``)."""
    gpu = select_config("gpu", 256, 48 * 1024)
    depthwise = ConvolutionDesc(MemoryDesc((1, 32, 28, 28)), MemoryDesc((32, 1, 3, 3)), None, None, (1, 1), (1, 1),
                                (1, 1), None, 32)
    dense = ConvolutionDesc(MemoryDesc((1, 32, 28, 28)), MemoryDesc((32, 32, 3, 3)), None, None, (1, 1), (1, 1),
                            (1, 1))
    assert not convolution_gemm.applies(depthwise, gpu)
    assert convolution_gemm.applies(dense, gpu)
    assert not convolution_gemm.applies(dense, select_config("cpu", 4096, 64 * 1024))
    assert convolution.generate(dense, gpu).impl.startswith("ocl:implicit_gemm:ck:")


async def test_depthwise_nhwc_runs_channels_fastest(gpu_shaped, rng):
    """The direct kernel's NHWC geometry on the GPU configuration: channels along dim 0."""
    src_dims, w_dims = (2, 40, 9, 9), (40, 1, 3, 3)
    desc = ConvolutionDesc(MemoryDesc(src_dims, strides="nhwc"), MemoryDesc(w_dims, strides="hwio"),
                           MemoryDesc((2, 40, 5, 5), strides="nhwc"), MemoryDesc((40,)), (2, 2), (1, 1), (1, 1),
                           None, 40, post_ops=(("binary", "mul", MemoryDesc((1, 40, 1, 1))),))
    arrays = {"src": ints(rng, src_dims), "weights": ints(rng, w_dims), "bias": ints(rng, (40,)),
              "post_op_0_src1": ints(rng, (1, 40, 1, 1))}
    primitive, got = await execute(gpu_shaped, desc, arrays)
    assert primitive.impl == "ocl:direct:oc1:lc64x4", primitive.impl
    np.testing.assert_array_equal(got, convolution.desc_reference(desc, arrays))


async def test_storage_types(gpu_shaped, rng):
    """bf16 src gathered four channels per access, f16 weights, a bf16 bias, an f16 dst: f32 math,
    exact on small integers."""
    src_dims, w_dims = (1, 4, 8, 8), (16, 4, 3, 3)
    desc = ConvolutionDesc(MemoryDesc(src_dims, "bf16", "nhwc"), MemoryDesc(w_dims, "f16", "hwio"),
                           MemoryDesc((1, 16, 8, 8), "f16", "nhwc"), MemoryDesc((16,), "bf16"), (1, 1), (1, 1), (1, 1))
    arrays = {"src": ints(rng, src_dims), "weights": ints(rng, w_dims), "bias": ints(rng, (16,))}
    primitive, got = await execute(gpu_shaped, desc, arrays)
    assert primitive.impl.startswith("ocl:implicit_gemm:kc:"), primitive.impl
    np.testing.assert_array_equal(got.astype(np.float32), convolution.desc_reference(desc, arrays).astype(np.float32))

"""CPU register blocks sized by the device's SIMD width (``KernelConfig.native_vector_width``: the
matmul micro-tile, the direct convolution's channel block, the attention's row vectors and key
blocks), and 1x1 convolutions run as matmuls (``convolution.pointwise_as_matmul``).

The engine's configuration is forced to each width in turn (16: AVX-512 blocks; 8: AVX2 ones,
where a float16 takes two registers), so both code shapes run whatever host runs the suite.
Inputs are small integers: every f32 sum is exact, so results equal the references bit for bit.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from _sweeps import execute, ints

from triodnn import MatmulDesc, MemoryDesc
from triodnn._values._convolution_desc import ConvolutionDesc
from triodnn._values._sdpa_desc import SdpaDesc
from triodnn.kernels import _post_ops, convolution, matmul, sdpa, select_config, tolerance


@pytest.fixture(params=[16, 8], ids=["simd16", "simd8"])
async def cpu_engine(request, engine):
    """(engine, config) with the CPU kernel configuration at SIMD width ``param``."""
    if engine._config.vector_width < 16:
        pytest.skip("CPU-shaped kernels: the engine is not a CPU device")
    engine._config = attrs.evolve(engine._config, native_vector_width=request.param)
    return engine, engine._config


def test_block_shapes_follow_the_simd_width():
    wide, narrow = select_config("cpu", 4096, 1 << 20), select_config("cpu", 4096, 1 << 20, native_vector_width=8)
    square = MatmulDesc(MemoryDesc((256, 64)), MemoryDesc((64, 256)))
    assert matmul.generate(square, wide).impl.startswith("ocl:regblock:6x64")
    assert matmul.generate(square, narrow).impl.startswith("ocl:regblock:6x16")
    row = MatmulDesc(MemoryDesc((1, 64)), MemoryDesc((64, 256)))
    assert matmul.generate(row, narrow).impl.startswith("ocl:regblock:1x64")
    nchw = ConvolutionDesc(MemoryDesc((1, 8, 9, 9)), MemoryDesc((17, 8, 3, 3)), padding_l=1)
    nhwc = ConvolutionDesc(MemoryDesc((1, 8, 9, 9), strides="nhwc"), MemoryDesc((17, 8, 3, 3), strides="hwio"),
                           padding_l=1)
    few = ConvolutionDesc(MemoryDesc((1, 8, 9, 9)), MemoryDesc((12, 8, 3, 3)), padding_l=1)
    assert convolution.generate(nchw, wide).impl.startswith("ocl:direct:oc16")
    assert convolution.generate(nchw, narrow).impl.startswith("ocl:packed_blocked:w6xc16")  # OIHW packed
    assert convolution.generate(nhwc, narrow).impl.startswith("ocl:nhwc_blocked:w6xc16")
    assert convolution.generate(few, narrow).impl.startswith("ocl:direct:oc6")  # under 16 channels


# src dims, weights dims, bias dims
MATMULS = {
    "edges_bias": ((37, 70), (70, 45), (45,)),
    "batch_broadcast": ((2, 3, 20, 33), (33, 17), None),
    "skinny": ((8, 300), (300, 40), (1, 40)),
    "two_rows": ((2, 70), (70, 100), None),
    "sixteen_rows": ((16, 50), (50, 70), (70,)),
    "one_row": ((1, 300), (300, 130), (130,)),
}


@pytest.mark.parametrize("case", list(MATMULS))
async def test_matmul_exact(cpu_engine, rng, case):
    engine, _ = cpu_engine
    src_dims, wei_dims, bias_dims = MATMULS[case]
    a, w = ints(rng, src_dims, bound=3), ints(rng, wei_dims, bound=3)
    arrays = {"src": a, "weights": w}
    if bias_dims is not None:
        arrays["bias"] = ints(rng, bias_dims, bound=3)
    chain = (("eltwise", "relu"), ("sum", 1.0))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), bias=None if bias_dims is None else MemoryDesc(bias_dims),
                      post_ops=chain)
    old = ints(rng, desc.dst.dims, bound=3)
    got = await execute(engine, desc, arrays, dst_init=old)
    np.testing.assert_array_equal(got, _post_ops.reference(chain, matmul.reference(a, w, arrays.get("bias")), old))


# src dims, src layout, weights dims, weights layout, dst layout, geometry, impl prefix (or one per
# SIMD width)
CONVOLUTIONS = {
    # NHWC 3x3: at width 8 positions x 16 channels per work-item (convolution_cpu), a channel block
    # past OC (20), the last block of each row shifted back (W 9 = 6 + 3).
    "nhwc_3x3_edges": ((2, 8, 7, 9), "nhwc", (20, 8, 3, 3), "hwio", "nhwc", dict(padding_l=1),
                       {16: "ocl:direct:oc16", 8: "ocl:nhwc_blocked:w6xc16"}),
    # Depthwise NHWC (20 channels: a block past them), stride 2: src read as 16 channels at once.
    "depthwise_nhwc": ((2, 20, 9, 14), "nhwc", (20, 1, 3, 3), "hwio", "nhwc", dict(strides=2, padding_l=1, groups=20),
                       {16: "ocl:direct:oc1", 8: "ocl:nhwc_blocked:w6xc16:dw"}),
    # Depthwise NCHW at stride 2 (W 40 -> 20: a block inside the row, one past its end and
    # its padding), and on 14-wide maps at stride 1 (one block of 16 lanes, 2 masked).
    "depthwise_nchw_strided": ((1, 20, 9, 40), None, (20, 1, 3, 3), None, None, dict(strides=2, padding_l=1, groups=20),
                               {16: "ocl:direct:oc1", 8: "ocl:dw_rows:w16:s2"}),
    "depthwise_nchw_small": ((2, 18, 14, 14), None, (18, 1, 3, 3), None, None, dict(padding_l=1, groups=18),
                             {16: "ocl:direct:oc1", 8: "ocl:dw_rows:w16:s1"}),
    # NDHWC at stride 2 with dilation, rows shorter than a block (W 4 -> blocks of 4).
    "ndhwc_strided_dilated": ((1, 4, 5, 6, 8), "ndhwc", (16, 4, 2, 3, 3), "dhwio", "ndhwc",
                              dict(strides=(1, 2, 2), padding_l=(0, 1, 2), dilation=(2, 1, 2)),
                              {16: "ocl:direct:oc16", 8: "ocl:nhwc_blocked:w4xc16"}),
    # 17 channels: per position at width 16; at width 8 the OIHW weights packed per work-item, one
    # full channel block and one past OC, NCHW dst stored lane by lane.
    "nchw_17_channels": ((2, 3, 7, 9), None, (17, 3, 3, 3), None, None, dict(padding_l=1),
                         {16: "ocl:direct:oc", 8: "ocl:packed_blocked:w6xc16"}),
    # NCHW at stride 2 with NHWC dst, packed weights, rows of 5 (one shifted block each).
    "nchw_strided_nhwc_dst": ((1, 4, 9, 10), None, (16, 4, 3, 3), None, "nhwc", dict(strides=2, padding_l=1),
                              {16: "ocl:direct:oc", 8: "ocl:packed_blocked:w5xc16"}),
    "row_vector": ((1, 4, 6, 37), None, (7, 4, 3, 3), None, None, dict(padding_l=1), "ocl:direct:row16:"),
    "pointwise_nchw_batch": ((2, 12, 5, 6), None, (20, 12, 1, 1), None, None, {}, "ocl:pointwise_matmul:"),
    "pointwise_nhwc": ((2, 12, 5, 6), "nhwc", (20, 12, 1, 1), "hwio", "nhwc", {}, "ocl:pointwise_matmul:"),
    "pointwise_3d": ((1, 8, 2, 3, 5), None, (9, 8, 1, 1, 1), None, None, {}, "ocl:pointwise_matmul:"),
    # an operand varying along W only cannot be a matmul operand (positions are one axis)
    "pointwise_operand_along_w": ((1, 8, 4, 6), None, (9, 8, 1, 1), None, None, {}, "ocl:direct:"),
}


@pytest.mark.parametrize("case", list(CONVOLUTIONS))
async def test_convolution_exact(cpu_engine, rng, case):
    """Bias, an output scale, sum, relu and a binary operand (per channel, or along W)."""
    engine, config = cpu_engine
    src_dims, src_layout, w_dims, w_layout, dst_layout, geo, impl = CONVOLUTIONS[case]
    nsp = len(src_dims) - 2
    operand_dims = (6,) if case == "pointwise_operand_along_w" else (1, w_dims[0]) + (1,) * nsp
    chain = (("sum", 1.0), ("binary", "add", MemoryDesc(operand_dims)), ("eltwise", "relu"))
    shape = ConvolutionDesc(MemoryDesc(src_dims), MemoryDesc(w_dims), **geo).dst.dims
    desc = ConvolutionDesc(MemoryDesc(src_dims, strides=src_layout), MemoryDesc(w_dims, strides=w_layout),
                           MemoryDesc(shape, strides=dst_layout), MemoryDesc((w_dims[0],)), **geo,
                           post_ops=chain, output_scale=2.0)
    impl = impl[config.native_vector_width] if isinstance(impl, dict) else impl
    assert convolution.generate(desc, config).impl.startswith(impl)
    arrays = {"src": ints(rng, src_dims, bound=3), "weights": ints(rng, w_dims, bound=3),
              "bias": ints(rng, (w_dims[0],), bound=3), "post_op_1_src1": ints(rng, operand_dims, bound=3)}
    old = ints(rng, shape, bound=3)
    got = await execute(engine, desc, arrays, dst_init=old)
    np.testing.assert_array_equal(got, convolution.desc_reference(desc, arrays | {"dst": old}))


async def test_sdpa_row_vectors(cpu_engine, rng):
    """Two row vectors of 8 keys per block at SIMD width 16, one of 6 at width 8: a causal mask
    and an additive one, several key blocks with an edge."""
    engine, config = cpu_engine
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float32) for _ in range(3))
    mask = rng.standard_normal((1, 1, 40, 40)).astype(np.float32)
    desc = SdpaDesc(MemoryDesc(q.shape), MemoryDesc(k.shape), MemoryDesc(v.shape), mask=MemoryDesc(mask.shape),
                    causal="top_left")
    primitive = await engine.create_primitive(desc)
    assert primitive.impl.startswith("ocl:sdpa:rowlanes:q32x8:" if config.native_vector_width == 16
                                     else "ocl:sdpa:rowlanes:q16x6:")
    got = await execute(engine, desc, {"query": q, "key": k, "value": v, "mask": mask}, primitive=primitive)
    tolerance.check(got, sdpa.reference(q, k, v, mask=mask, causal="top_left"), 1e-5)

"""Convolution forward: 1D/2D/3D, strides, asymmetric padding, dilation, groups, bias, layouts.

Inputs are small integers, so f32 sums are exact and results compare with ``array_equal`` against
the float64 numpy reference (itself checked against a plain loop once).
"""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import MemoryDesc
from triodnn._values._convolution_desc import ConvolutionDesc
from triodnn.kernels import convolution, select_config, tolerance


def ints(rng, shape) -> np.ndarray:
    return rng.integers(-3, 4, shape).astype(np.float32)


async def run(engine, desc: ConvolutionDesc, arrays: dict, primitive=None) -> np.ndarray:
    if primitive is None:
        primitive = await engine.create_primitive(desc)
    stream = await engine.stream()
    args = {name: await engine.from_numpy(arrays[name], desc.arg_descs[name]) for name in arrays}
    args["dst"] = engine.memory(desc.dst)
    await stream.execute(primitive, args)
    return await args["dst"].to_numpy()


def loop_reference(x, w, b, s, pl, dil, groups, out):
    """A plain loop, 2-D only: checks the einsum reference."""
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    ocg = oc // groups
    y = np.zeros((n, oc) + out)
    for bn in range(n):
        for o in range(oc):
            g = o // ocg
            for oh in range(out[0]):
                for ow in range(out[1]):
                    acc = 0.0 if b is None else float(b[o])
                    for ic in range(icg):
                        for i in range(kh):
                            for j in range(kw):
                                ih = oh * s[0] - pl[0] + i * dil[0]
                                iw = ow * s[1] - pl[1] + j * dil[1]
                                if 0 <= ih < h and 0 <= iw < wd:
                                    acc += x[bn, g * icg + ic, ih, iw] * w[o, ic, i, j]
                    y[bn, o, oh, ow] = acc
    return y


def test_reference_matches_a_plain_loop(rng):
    x, w, b = ints(rng, (2, 4, 7, 6)), ints(rng, (6, 2, 3, 2)), ints(rng, (6,))
    kw = dict(strides=(2, 1), padding_l=(1, 0), padding_r=(2, 1), dilation=(1, 2), groups=2)
    got = convolution.reference(x, w, b, **kw)
    np.testing.assert_array_equal(got, loop_reference(x, w, b, (2, 1), (1, 0), (1, 2), 2, got.shape[2:]))


# (src dims, OC, kernel, strides, padding_l, padding_r, dilation, groups, bias, layout)
CASES = {
    "1d": ((2, 3, 11), 5, (3,), 1, 0, None, 1, 1, True, None),
    "1d-strided-padded-nwc": ((1, 4, 13), 6, (4,), 3, 2, 1, 1, 1, False, "nwc"),
    "1d-dilated": ((2, 2, 17), 3, (3,), 2, 1, 3, 3, 1, True, None),
    "2d": ((2, 3, 9, 8), 7, (3, 3), 1, 1, None, 1, 1, True, None),
    "2d-nhwc": ((2, 5, 7, 6), 4, (3, 2), 1, 1, None, 1, 1, True, "nhwc"),
    "2d-strided-asym-pad": ((1, 3, 10, 11), 5, (3, 3), (2, 3), (1, 0), (2, 1), 1, 1, False, None),
    "2d-dilated-nhwc": ((1, 2, 12, 9), 3, (3, 2), 1, (2, 1), (0, 3), (2, 3), 1, True, "nhwc"),
    "2d-groups2": ((2, 4, 6, 7), 6, (3, 3), 1, 1, None, 1, 2, True, None),
    "2d-depthwise-nhwc": ((1, 8, 9, 7), 8, (3, 3), 2, 1, None, 1, 8, True, "nhwc"),
    "2d-17-channels": ((1, 3, 5, 4), 17, (1, 1), 1, 0, None, 1, 1, True, None),     # channel-block edge
    "2d-groups-edge": ((1, 6, 5, 5), 34, (2, 2), 1, 0, 1, 1, 2, False, "nhwc"),     # 17 per group
    "3d": ((1, 2, 5, 6, 4), 3, (3, 2, 2), 1, 1, None, 1, 1, True, None),
    "3d-ndhwc-strided-dilated": ((2, 3, 7, 5, 6), 4, (2, 3, 2), (2, 1, 2), (1, 0, 1), (0, 2, 1), (2, 1, 1), 1, False, "ndhwc"),
    "3d-groups3": ((1, 6, 4, 4, 5), 3, (1, 2, 3), 1, (0, 1, 1), None, 1, 3, True, None),
    "kernel-equals-input": ((1, 2, 3, 4), 2, (3, 4), 1, 0, None, 1, 1, True, None),
    # Innermost output >= 16 with src contiguous there: the CPU row-vector path (16 lanes along W).
    "row-2d-17-channels": ((2, 3, 5, 37), 17, (3, 3), 1, 1, None, 1, 1, True, None),  # shifted last block
    "row-2d-dilated-asym-groups": ((1, 4, 6, 40), 6, (2, 3), (2, 1), (0, 2), (1, 3), (1, 3), 2, False, None),
    "row-2d-depthwise": ((1, 5, 4, 16), 5, (3, 3), 1, 1, None, 1, 5, True, None),
    "row-1d": ((2, 3, 50), 4, (5,), 1, 4, 0, 1, 1, True, None),
    "row-1d-wide-padding": ((1, 2, 16), 3, (3,), 1, 20, None, 1, 1, False, None),       # all-padding taps
    "row-3d": ((1, 2, 3, 4, 20), 3, (2, 2, 3), (1, 2, 1), 1, None, (1, 1, 2), 1, True, None),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_matches_reference_exactly(engine, rng, case):
    src_dims, oc, k, s, pl, pr, dil, groups, with_bias, layout = case
    x = ints(rng, src_dims)
    w = ints(rng, (oc, src_dims[1] // groups) + k)
    arrays = {"src": x, "weights": w}
    if with_bias:
        arrays["bias"] = ints(rng, (oc,))
    desc = ConvolutionDesc(
        MemoryDesc(src_dims, "f32", layout),
        MemoryDesc(w.shape),
        bias=MemoryDesc((oc,)) if with_bias else None,
        strides=s, padding_l=pl, padding_r=pr, dilation=dil, groups=groups,
    )
    if layout is not None:  # dst takes src's axis order
        assert desc.dst == MemoryDesc(desc.dst.dims, "f32", layout)
    got = await run(engine, desc, arrays)
    want = convolution.reference(
        x, w, arrays.get("bias"), strides=desc.strides, padding_l=desc.padding_l,
        padding_r=desc.padding_r, dilation=desc.dilation, groups=groups,
    )
    assert got.shape == want.shape == desc.dst.dims
    np.testing.assert_array_equal(got, want)


async def test_mixed_layouts_and_strided_weights(engine, rng):
    """NHWC src into an NCHW dst, weights stored hwio, src rows padded."""
    x, w, b = ints(rng, (2, 4, 6, 5)), ints(rng, (3, 4, 3, 3)), ints(rng, (3,))
    src = MemoryDesc(x.shape, "f32", (4 * 6 * 8, 1, 8 * 4, 4))  # nhwc with W padded to 8
    desc = ConvolutionDesc(src, MemoryDesc(w.shape, "f32", "hwio"), MemoryDesc((2, 3, 6, 5)),
                           MemoryDesc((3,), "f32", (2,)), padding_l=1)
    got = await run(engine, desc, {"src": x, "weights": w, "bias": b})
    np.testing.assert_array_equal(got, convolution.reference(x, w, b, padding_l=(1, 1)))


def test_parameters_resolve_to_tuples_and_one_descriptor():
    a = ConvolutionDesc(MemoryDesc((1, 2, 5, 5)), MemoryDesc((3, 2, 3, 3)), strides=2, padding_l=1)
    b = ConvolutionDesc(MemoryDesc((1, 2, 5, 5)), MemoryDesc((3, 2, 3, 3)), strides=(2, 2),
                        padding_l=[1, 1], padding_r=(1, 1), dilation=(1, 1), groups=1)
    assert a == b and hash(a) == hash(b)
    assert a.dst.dims == (1, 3, 3, 3) and a.padding_r == (1, 1) and a.dilation == (1, 1)
    assert a.kind == "convolution" and tuple(a.arg_descs) == ("src", "weights", "dst")
    spec = convolution.generate(a, select_config("cpu", 4096))
    assert spec.arg_names == ("src", "weights", "dst") and spec.impl.startswith("ocl:direct")


def test_cpu_path_choice():
    """Contiguous W, stride 1, OW >= 16: row vectors; NHWC src or W stride 2 or OW < 16: per-position.
    The GPU configuration takes the implicit GEMM (tests/kernels/test_convolution_gemm.py)."""
    cpu = select_config("cpu", 4096)
    resnet = ConvolutionDesc(MemoryDesc((1, 64, 56, 56)), MemoryDesc((64, 64, 3, 3)), padding_l=1)
    assert convolution.generate(resnet, cpu).impl.startswith("ocl:direct:row16:oc16")
    for desc in (
        ConvolutionDesc(MemoryDesc((1, 64, 56, 56), "f32", "nhwc"), MemoryDesc((64, 64, 3, 3)), padding_l=1),
        ConvolutionDesc(MemoryDesc((1, 64, 56, 56)), MemoryDesc((64, 64, 3, 3)), strides=2, padding_l=1),
        ConvolutionDesc(MemoryDesc((1, 64, 15, 15)), MemoryDesc((64, 64, 3, 3)), padding_l=1),
    ):
        assert convolution.generate(desc, cpu).impl.startswith("ocl:direct:oc")
    assert convolution.generate(resnet, select_config("gpu", 1024)).impl.startswith("ocl:implicit_gemm:ck:")


async def test_one_primitive_reused(engine, build, rng):
    desc = ConvolutionDesc(MemoryDesc((1, 3, 6, 6)), MemoryDesc((4, 3, 3, 3)), padding_l=1)
    prim = (await build({"c": desc}))["c"]
    for _ in range(2):
        x, w = ints(rng, (1, 3, 6, 6)), ints(rng, (4, 3, 3, 3))
        got = await run(engine, desc, {"src": x, "weights": w}, prim)
        np.testing.assert_array_equal(got, convolution.reference(x, w, padding_l=(1, 1)))


S2, W2 = MemoryDesc((1, 4, 6, 6)), MemoryDesc((6, 4, 3, 3))


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: ConvolutionDesc(MemoryDesc((4, 6)), MemoryDesc((2, 4))), triodnn.InvalidArgumentError, "src dims"),
        (lambda: ConvolutionDesc(S2, MemoryDesc((6, 4, 3))), triodnn.ArgumentMismatchError, "weights dims"),
        (lambda: ConvolutionDesc(S2, MemoryDesc((6, 2, 3, 3)), groups=3), triodnn.ArgumentMismatchError, "src channels 4"),
        (lambda: ConvolutionDesc(S2, MemoryDesc((5, 2, 3, 3)), groups=2), triodnn.ArgumentMismatchError,
         "weights output channels 5"),
        (lambda: ConvolutionDesc(S2, MemoryDesc((6, 4, 3, 3)), groups=2), triodnn.ArgumentMismatchError, "weights dims"),
        (lambda: ConvolutionDesc(S2, MemoryDesc((6, 4, 7, 3))), triodnn.ArgumentMismatchError, "weights kernel size 7"),
        (lambda: ConvolutionDesc(S2, W2, dilation=3), triodnn.ArgumentMismatchError, "dilated extent 7"),
        (lambda: ConvolutionDesc(S2, W2, MemoryDesc((1, 6, 6, 6))), triodnn.ArgumentMismatchError, "dst dims"),
        (lambda: ConvolutionDesc(S2, W2, bias=MemoryDesc((1, 6))), triodnn.ArgumentMismatchError, "bias dims"),
        (lambda: ConvolutionDesc(S2, W2, bias=MemoryDesc((4,))), triodnn.ArgumentMismatchError, "bias dims"),
        (lambda: ConvolutionDesc(S2, W2, strides=0), triodnn.InvalidArgumentError, "strides"),
        (lambda: ConvolutionDesc(S2, W2, strides=(1, 1, 1)), triodnn.InvalidArgumentError, "strides"),
        (lambda: ConvolutionDesc(S2, W2, padding_l=-1), triodnn.InvalidArgumentError, "padding_l"),
        (lambda: ConvolutionDesc(S2, W2, padding_r=(0, 1.5)), triodnn.InvalidArgumentError, "padding_r"),
        (lambda: ConvolutionDesc(S2, W2, dilation=0), triodnn.InvalidArgumentError, "oneDNN's 0"),
        (lambda: ConvolutionDesc(S2, W2, groups=0), triodnn.InvalidArgumentError, "groups"),
        (lambda: ConvolutionDesc("src", W2), triodnn.InvalidArgumentError, "src is str"),
        (lambda: ConvolutionDesc(S2, None), triodnn.InvalidArgumentError, "weights is NoneType"),
    ],
)
def test_bad_inputs_name_the_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


async def test_non_f32_is_unsupported(engine):
    """f16 src and weights are fine (tests/primitives/test_dtypes_more.py); a post-op operand must be f32."""
    desc = ConvolutionDesc(MemoryDesc((1, 2, 5, 5), "f16"), MemoryDesc((3, 2, 3, 3), "f16"),
                           post_ops=(("binary", "mul", MemoryDesc((1, 3, 1, 1), "f16")),))
    with pytest.raises(triodnn.UnsupportedError, match="post_op_0_src1 has dtype 'f16'"):
        await engine.create_primitive(desc)


async def test_random_floats_within_reduction_scaled_tolerance(engine, rng):
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    desc = ConvolutionDesc(MemoryDesc(x.shape, "f32", "nhwc"), MemoryDesc(w.shape), padding_l=1)
    got = await run(engine, desc, {"src": x, "weights": w})
    tolerance.check(got, convolution.reference(x, w, padding_l=(1, 1)), 1e-6 * 16 * 9)

"""Deconvolution (transposed convolution) against its float64 reference, and the reference
against the convolution's: a deconvolution is the adjoint of the convolution it transposes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc
from triodnn._values._deconvolution_desc import DeconvolutionDesc
from triodnn.kernels import convolution, deconvolution, kind_of, select_config, tolerance

# name: (src dims, weights dims, keyword geometry, bias, src strides, dst strides)
CASES = {
    "2d_stride2": ((1, 4, 5, 5), (4, 3, 3, 3), {"strides": 2, "padding_l": 1}, True, None, None),
    "2d_asym_pads_out_pad": ((2, 3, 4, 6), (3, 5, 3, 2), {"strides": (2, 3), "padding_l": (0, 1), "padding_r": (2, 0),
                                                           "output_padding": (1, 2)}, False, None, None),
    "2d_dilated": ((1, 2, 4, 4), (2, 3, 3, 3), {"dilation": 2, "padding_l": 1}, True, None, None),
    "2d_groups_nhwc": ((2, 6, 3, 4), (6, 2, 2, 3), {"strides": 2, "groups": 3}, True, "acdb", "acdb"),
    "1d": ((2, 3, 7), (3, 4, 3), {"strides": 3, "padding_l": 2, "padding_r": 1}, True, None, None),
    "3d": ((1, 2, 2, 3, 3), (2, 3, 2, 2, 3), {"strides": (1, 2, 2), "padding_l": (0, 1, 1)}, False, None, None),
    "large_pad_end": ((1, 4, 6, 6), (4, 5, 3, 3), {"strides": 2, "padding_r": 7}, False, None, None),
    # Channel blocks: 12 per group in blocks of 6 (CPU) or 4 (GPU); 11, a prime, one at a time.
    "blocked_12": ((1, 6, 3, 4), (6, 12, 3, 3), {"strides": 2, "groups": 2}, True, None, "acdb"),
    "prime_11": ((1, 2, 3, 3), (2, 11, 2, 2), {}, True, None, None),
}


def _descs():
    out = {}
    for name, (s, w, geometry, bias, ss, ds) in CASES.items():
        probe = DeconvolutionDesc(MemoryDesc(s), MemoryDesc(w), **geometry)
        out[name] = DeconvolutionDesc(MemoryDesc(s, "f32", ss), MemoryDesc(w), MemoryDesc(probe.dst.dims, "f32", ds),
                                      MemoryDesc((probe.dst.dims[1],)) if bias else None, **geometry)
    return out


@pytest.fixture(params=["device", "gpu_shaped"])
def shape(request, engine):
    """The device's own kernel configuration, or the GPU one (channel blocks of 4, work-groups of
    up to 256) set on the engine as tests/kernels/test_gpu_shaped_kernels.py does."""
    if request.param == "gpu_shaped":
        engine._config = select_config("gpu", engine.info.max_work_group_size)
    return request.param


async def test_every_case(shape, engine, build, upload, rng):
    descs = _descs()
    prims = await build(descs)
    stream = await engine.stream()
    for name, desc in descs.items():
        assert prims[name].impl.startswith("ocl:deconv_gather:")
        inputs = {arg: rng.uniform(-2.0, 2.0, md.dims).astype(np.float32)
                  for arg, md in desc.arg_descs.items() if arg != "dst"}
        args = {arg: await upload(x, desc.arg_descs[arg].strides) for arg, x in inputs.items()}
        args["dst"] = engine.memory(desc.dst)
        await stream.execute(prims[name], args)
        try:
            tolerance.check(await args["dst"].to_numpy(), kind_of(desc).reference(desc, inputs),
                            kind_of(desc).tolerance(desc))
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None


async def test_integer_data_is_exact(engine, rng):
    """Small integers: every product and sum is exact in f32, whatever the order."""
    desc = DeconvolutionDesc(MemoryDesc((1, 8, 5, 5)), MemoryDesc((8, 4, 3, 3)), strides=2, groups=2, padding_l=1)
    prim = await engine.create_primitive(desc)
    x = rng.integers(-4, 5, desc.src.dims).astype(np.float32)
    w = rng.integers(-4, 5, desc.weights.dims).astype(np.float32)
    args = {"src": await engine.from_numpy(x), "weights": await engine.from_numpy(w), "dst": engine.memory(desc.dst)}
    await (await engine.stream()).execute(prim, args)
    np.testing.assert_array_equal(await args["dst"].to_numpy(), deconvolution.desc_reference(desc, {"src": x, "weights": w}))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_low_precision_storage(dtype, engine, rng):
    src = MemoryDesc((1, 3, 4, 4), dtype)
    desc = DeconvolutionDesc(src, MemoryDesc((3, 2, 3, 3), dtype), bias=MemoryDesc((2,), dtype), strides=2)
    prim = await engine.create_primitive(desc)
    arrays = {name: rng.integers(-4, 5, md.dims).astype(np.float32) for name, md in desc.arg_descs.items() if name != "dst"}
    args = {name: await engine.from_numpy(x, desc.arg_descs[name]) for name, x in arrays.items()}
    args["dst"] = engine.memory(desc.dst)
    await (await engine.stream()).execute(prim, args)
    # Integer sums of at most 3 * 9 products of integers up to 4: exact in f32, then one rounding.
    np.testing.assert_array_equal(await args["dst"].to_numpy(), kind_of(desc).reference(desc, arrays))


@pytest.mark.parametrize("geometry", [
    {"strides": 2, "padding_l": 1, "groups": 1},
    {"strides": 3, "padding_l": 0, "dilation": 2, "groups": 2},
])
def test_reference_is_the_adjoint_of_convolution(geometry, rng):
    """<conv(x, W), y> == <x, deconv(y, W)>: the deconvolution's weights (IC_d, OC_d/g, k) are the
    convolution's (OC_c, IC_c/g, k) as they are; output_padding recovers the rows the stride drops."""
    groups = geometry["groups"]
    x = rng.standard_normal((2, 4, 9, 8))
    w = rng.standard_normal((6, 4 // groups, 3, 3))
    s, p, d = geometry["strides"], geometry["padding_l"], geometry.get("dilation", 1)
    y_conv = convolution.reference(x, w, strides=(s, s), padding_l=(p, p), dilation=(d, d), groups=groups)
    y = rng.standard_normal(y_conv.shape)
    out_pad = tuple(x.shape[2 + i] - ((y.shape[2 + i] - 1) * s + (3 - 1) * d + 1 - 2 * p) for i in range(2))
    back = deconvolution.reference(y, w, strides=(s, s), padding_l=(p, p), dilation=(d, d), groups=groups,
                                   output_padding=out_pad)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.sum(y_conv.astype(np.float64) * y), np.sum(x * back.astype(np.float64)), rtol=1e-5)


def test_channel_blocks_divide_the_group():
    cpu, gpu = select_config("cpu", 4096), select_config("gpu", 256)
    assert [deconvolution.channel_block(cpu, n) for n in (1, 5, 8, 12, 11, 128)] == [1, 5, 8, 6, 1, 8]
    assert [deconvolution.channel_block(gpu, n) for n in (1, 5, 8, 12, 11, 128)] == [1, 1, 4, 4, 1, 4]
    desc = DeconvolutionDesc(MemoryDesc((1, 32, 4, 4)), MemoryDesc((32, 128, 3, 3)), strides=2)
    assert deconvolution.generate(desc, cpu).impl.startswith("ocl:deconv_gather:b8")
    assert deconvolution.generate(desc, gpu).impl.startswith("ocl:deconv_gather:b4")


def test_output_size_and_defaults():
    desc = DeconvolutionDesc(MemoryDesc((1, 32, 28, 28)), MemoryDesc((32, 128, 3, 3)), strides=2, padding_r=41)
    assert desc.dst.dims == (1, 128, 16, 16)  # benchdnn's op/f32/deconv.json
    assert desc.padding_l == (0, 0) and desc.output_padding == (0, 0) and desc.label == "deconvolution 2d"
    nhwc = DeconvolutionDesc(MemoryDesc((1, 4, 3, 3), "f32", "acdb"), MemoryDesc((4, 2, 2, 2)), groups=2)
    assert nhwc.dst.dims == (1, 4, 4, 4) and nhwc.dst.strides == (64, 1, 16, 4)
    assert nhwc.label == "deconvolution 2d g2"


def test_bad_arguments():
    src = MemoryDesc((1, 4, 5, 5))
    with pytest.raises(ArgumentMismatchError, match=r"weights dims \(3, 2, 3, 3\) have 3 input channels"):
        DeconvolutionDesc(src, MemoryDesc((3, 2, 3, 3)))
    with pytest.raises(ArgumentMismatchError, match="not divisible by groups 3"):
        DeconvolutionDesc(src, MemoryDesc((4, 2, 3, 3)), groups=3)
    with pytest.raises(ArgumentMismatchError, match="leaves no output"):
        DeconvolutionDesc(src, MemoryDesc((4, 2, 3, 3)), padding_l=4, padding_r=4)
    with pytest.raises(ArgumentMismatchError, match=r"dst dims \(1, 2, 5, 5\) differ"):
        DeconvolutionDesc(src, MemoryDesc((4, 2, 3, 3)), MemoryDesc((1, 2, 5, 5)))
    with pytest.raises(ArgumentMismatchError, match=r"bias dims \(4,\) must be \(2,\)"):
        DeconvolutionDesc(src, MemoryDesc((4, 2, 3, 3)), bias=MemoryDesc((4,)))
    with pytest.raises(ArgumentMismatchError, match="must be \\(IC, OC/groups"):
        DeconvolutionDesc(src, MemoryDesc((4, 2, 3)))
    with pytest.raises(InvalidArgumentError, match="output_padding"):
        DeconvolutionDesc(src, MemoryDesc((4, 2, 3, 3)), output_padding=(1, -1))
    with pytest.raises(InvalidArgumentError, match="src dims"):
        DeconvolutionDesc(MemoryDesc((4, 5)), MemoryDesc((4, 5)))
    with pytest.raises(InvalidArgumentError, match="groups 0"):
        DeconvolutionDesc(src, MemoryDesc((4, 2, 3, 3)), groups=0)
    for name in ("src", "weights"):
        with pytest.raises(InvalidArgumentError, match=name):
            DeconvolutionDesc(**{"src": src, "weights": MemoryDesc((4, 2, 3, 3)), name: (1, 2)})


def test_gather_matches_scatter_on_every_output():
    """The kernel's gather rule, written out in Python, against the scatter reference."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 2, 4)), rng.standard_normal((2, 3, 3))
    s, pl, pr, dil, op = 2, 1, 0, 2, 1
    want = deconvolution.reference(x, w, strides=(s,), padding_l=(pl,), padding_r=(pr,), dilation=(dil,),
                                   output_padding=(op,))
    got = np.zeros(want.shape)
    for oc, o in itertools.product(range(3), range(want.shape[2])):
        for k in range(3):
            t = o + pl - k * dil
            if t >= 0 and t % s == 0 and t // s < 4:
                got[0, oc, o] += x[0, :, t // s] @ w[:, oc, k]
    np.testing.assert_allclose(got, want, rtol=1e-6)

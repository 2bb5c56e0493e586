"""Every eltwise algorithm against its numpy reference, on each code path the generator has."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from triodnn import EltwiseDesc, MemoryDesc
from triodnn.kernels import eltwise, tolerance

SHAPE = (5, 37)  # 185 elements: not a multiple of 16, so the flat path's tail loop runs
PADDED = (40, 1)  # rows of 37 padded to 40
PARAMS = {"relu": dict(alpha=0.125), "clip": dict(alpha=-1.5, beta=2.25)}
SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 88.0, -88.0, 100.0, -100.0, 3e38, -3e38, 1e-3],
    np.float32,
)


def read_raw(engine, memory) -> np.ndarray:
    """The whole buffer, padding included, read with plain pyopencl."""
    host = np.empty(memory.desc.span, np.float32)
    queue = cl.CommandQueue(engine.cl_context, engine.cl_device)
    cl.enqueue_copy(queue, host, memory.cl_buffer).wait()
    return host


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the reference's inf
@pytest.mark.parametrize("alg", eltwise.ALGORITHMS)
async def test_algorithm_on_every_path(alg, engine, build, upload, make_input):
    """Flat (vector + tail), in-place, strided general path, and strided in-place."""
    params = PARAMS.get(alg, {})
    threshold = tolerance.eltwise(alg)
    x = make_input(alg, SHAPE)
    ref = eltwise.reference(alg, x, **params)
    dense = MemoryDesc(SHAPE)
    padded = MemoryDesc(SHAPE, "f32", PADDED)
    prims = await build({
        "flat": EltwiseDesc(alg, dense, **params),
        "strided": EltwiseDesc(alg, MemoryDesc(SHAPE, "f32", "ba"), padded, **params),
        "padded": EltwiseDesc(alg, padded, **params),
    })
    assert prims["flat"].impl.startswith("ocl:flat:")
    assert prims["strided"].impl.startswith("ocl:strided:")
    assert prims["padded"].impl.startswith("ocl:strided:")
    assert prims["flat"].kind == "eltwise" and prims["flat"].label == f"eltwise:{alg}"
    stream = await engine.stream()

    src, dst = await upload(x), engine.memory(dense)
    await stream.execute(prims["flat"], {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), ref, threshold)
    np.testing.assert_array_equal(await src.to_numpy(), x)  # the source is left alone

    await stream.execute(prims["flat"], {"src": src, "dst": src})  # in place
    tolerance.check(await src.to_numpy(), ref, threshold)

    src_t, dst_p = await upload(x, "ba"), engine.memory(padded)
    await dst_p.write(np.zeros(SHAPE, np.float32))  # padding is zero from here on
    await stream.execute(prims["strided"], {"src": src_t, "dst": dst_p})
    tolerance.check(await dst_p.to_numpy(), ref, threshold)
    raw = read_raw(engine, dst_p).reshape(-1)
    pad = np.ones(raw.shape, bool)
    pad[np.add.outer(np.arange(SHAPE[0]) * PADDED[0], np.arange(SHAPE[1])).ravel()] = False
    assert np.all(raw[pad] == 0), "the kernel wrote into row padding"

    inplace = await upload(x, PADDED)
    await stream.execute(prims["padded"], {"src": inplace, "dst": inplace})
    tolerance.check(await inplace.to_numpy(), ref, threshold)
    assert np.all(read_raw(engine, inplace)[pad] == 0)

    # Special values through both the vector part and the tail: inf/nan must match exactly.
    values = SPECIAL
    special = x.copy().reshape(-1)
    special[: len(values)] = values
    special[-len(values):] = values
    special = special.reshape(SHAPE)
    await src.write(special)
    await stream.execute(prims["flat"], {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), eltwise.reference(alg, special, **params), threshold)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 48, 1001])
async def test_flat_path_sizes(n, engine, upload, rng):
    """Sizes below, at and above the vector width: the tail work-item covers exactly the rest."""
    x = rng.uniform(-3, 3, n).astype(np.float32)
    prim = await engine.create_primitive(EltwiseDesc("square", MemoryDesc((n,))))
    assert prim.impl.startswith("ocl:flat:")
    src, dst = await upload(x), engine.memory(MemoryDesc((n,)))
    stream = await engine.stream()
    await stream.execute(prim, {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), eltwise.reference("square", x), tolerance.eltwise("square"))


async def test_dense_permuted_layout_runs_flat(engine, upload, rng):
    """Dense column-major src and dst: elementwise does not care about order, so it runs flat."""
    x = rng.uniform(-3, 3, (6, 21)).astype(np.float32)
    desc = MemoryDesc(x.shape, "f32", "ba")
    prim = await engine.create_primitive(EltwiseDesc("tanh", desc))
    assert prim.impl.startswith("ocl:flat:")
    src, dst = await upload(x, "ba"), engine.memory(desc)
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), eltwise.reference("tanh", x), tolerance.eltwise("tanh"))


async def test_relu_negative_slope(engine, build, upload):
    x = np.array([-4.0, -1.0, -0.5, -0.0, 0.0, 0.25, 3.0, -1e-30, 7.5] * 3, np.float32)
    prims = await build({
        "slope": EltwiseDesc("relu", MemoryDesc(x.shape), alpha=0.25),
        "plain": EltwiseDesc("relu", MemoryDesc(x.shape)),
    })
    stream = await engine.stream()
    src, dst = await upload(x), engine.memory(MemoryDesc(x.shape))
    await stream.execute(prims["slope"], {"src": src, "dst": dst})
    got = await dst.to_numpy()
    np.testing.assert_array_equal(got, np.where(x > 0, x, x * np.float32(0.25)))
    np.testing.assert_array_equal(got, eltwise.reference("relu", x, alpha=0.25))
    await stream.execute(prims["plain"], {"src": src, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))


async def test_clip_bounds_are_exclusive_low_inclusive_high(engine, upload):
    """oneDNN's clip: ``alpha < x <= beta`` passes through; the bounds themselves map to themselves."""
    alpha, beta = np.float32(-0.5), np.float32(0.75)
    x = np.array(
        [-9, alpha, np.nextafter(alpha, 0), np.nextafter(alpha, -1), 0, 0.7, beta,
         np.nextafter(beta, 1), np.nextafter(beta, 0), 9, -0.0, 0.5] * 2,
        np.float32,
    )
    prim = await engine.create_primitive(EltwiseDesc("clip", MemoryDesc(x.shape), alpha=alpha, beta=beta))
    src, dst = await upload(x), engine.memory(MemoryDesc(x.shape))
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    got = await dst.to_numpy()
    np.testing.assert_array_equal(got, np.clip(x, alpha, beta))
    np.testing.assert_array_equal(got, eltwise.reference("clip", x, alpha=alpha, beta=beta))


async def test_gelu_tanh_of_large_negative_inputs(engine, upload):
    """gelu_tanh(x) -> 0 as x -> -inf; the result must stay within the eltwise tolerance there."""
    x = np.array([-2000.0, -5000.0, -1e4, -1e30, -3e38, -1500.0] * 4, np.float32)
    prim = await engine.create_primitive(EltwiseDesc("gelu_tanh", MemoryDesc(x.shape)))
    src, dst = await upload(x), engine.memory(MemoryDesc(x.shape))
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    tolerance.check(await dst.to_numpy(), eltwise.reference("gelu_tanh", x), tolerance.eltwise("gelu_tanh"))


def test_reference_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="'softplus'"):
        eltwise.reference("softplus", np.zeros(3))

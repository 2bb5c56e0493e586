"""Every eltwise algorithm against its numpy reference, on each code path the generator has."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from triodnn import EltwiseDesc, InvalidArgumentError, MemoryDesc
from triodnn.kernels import KernelConfig, eltwise, tolerance

SHAPE = (5, 37)  # 185 elements: not a multiple of 16, so the flat path's tail loop runs
PADDED = (40, 1)  # rows of 37 padded to 40
# Parameters off the defaults, so each one reaches the kernel; hardswish and soft_relu also run
# with their defaults in the tests below.
PARAMS = {
    "relu": dict(alpha=0.125),
    "leaky_relu": dict(alpha=0.2),
    "clip": dict(alpha=-1.5, beta=2.25),
    "elu": dict(alpha=0.75),
    "swish": dict(alpha=1.25),
    "hardswish": dict(alpha=0.25, beta=0.375),
    "hardsigmoid": dict(alpha=0.2, beta=0.5),
    "linear": dict(alpha=-1.5, beta=0.75),
    "pow": dict(alpha=1.5, beta=3.0),  # an integer power: defined for negative x too
    "soft_relu": dict(alpha=1.5),
}
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


async def test_swish_elu_and_hardsigmoid_without_parameters_compute_what_their_names_say(engine, build, upload):
    """A user's 166 wrong results came from ``EltwiseDesc("swish", d)`` computing x / 2 (alpha 0)."""
    x = np.linspace(-4, 4, 33, dtype=np.float32)
    x64 = x.astype(np.float64)
    want = {"swish": x64 / (1 + np.exp(-x64)), "elu": np.where(x64 > 0, x64, np.expm1(x64)),
            "hardsigmoid": np.clip(x64 + 3, 0, 6) / 6}
    prims = await build({alg: EltwiseDesc(alg, MemoryDesc(x.shape)) for alg in want})
    stream = await engine.stream()
    src, dst = await upload(x), engine.memory(MemoryDesc(x.shape))
    for alg, expected in want.items():
        await stream.execute(prims[alg], {"src": src, "dst": dst})
        tolerance.check(await dst.to_numpy(), expected, tolerance.eltwise(alg))


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


async def run_one(engine, upload, desc: EltwiseDesc, x: np.ndarray) -> np.ndarray:
    """``desc`` (dense, of ``x``'s shape) applied to ``x`` on the device."""
    prim = await engine.create_primitive(desc)
    src, dst = await upload(x), engine.memory(desc.dst)
    await (await engine.stream()).execute(prim, {"src": src, "dst": dst})
    return await dst.to_numpy()


def test_every_algorithm_has_a_reference_and_a_tolerance():
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    for alg in eltwise.ALGORITHMS:
        assert eltwise.reference(alg, x, **PARAMS.get(alg, {})).dtype == np.float32
        assert tolerance.eltwise(alg) in (tolerance.ELTWISE, tolerance.ELTWISE_TRANSCENDENTAL)
    assert tolerance.eltwise("mish") == tolerance.ELTWISE_TRANSCENDENTAL
    assert tolerance.eltwise("round") == tolerance.eltwise("hardswish") == tolerance.ELTWISE


def test_defaults_follow_onednn():
    """hardswish is x * relu6(x + 3) / 6 and soft_relu is log(1 + e^x) unless told otherwise; the
    descriptor holds the resolved numbers, so omitted and explicit defaults are one primitive.
    Where oneDNN asks the caller, an omitted parameter means what the name means elsewhere (swish
    is SiLU, elu's alpha 1, linear and pow the identity), not 0; clip has no default."""
    src = MemoryDesc((4,))
    hardswish = EltwiseDesc("hardswish", src)
    assert (hardswish.alpha, hardswish.beta) == (1.0 / 6.0, 0.5)
    assert hardswish == EltwiseDesc("hardswish", src, alpha=1.0 / 6.0, beta=0.5)
    assert hash(hardswish) == hash(EltwiseDesc("hardswish", src, alpha=1.0 / 6.0, beta=0.5))
    assert EltwiseDesc("soft_relu", src).alpha == 1.0
    for alg in ("relu", "leaky_relu"):
        desc = EltwiseDesc(alg, src)
        assert (desc.alpha, desc.beta) == (0.0, 0.0), alg
    defaults = {alg: (EltwiseDesc(alg, src).alpha, EltwiseDesc(alg, src).beta)
                for alg in ("elu", "swish", "hardsigmoid", "linear", "pow")}
    assert defaults == {"elu": (1.0, 0.0), "swish": (1.0, 0.0), "hardsigmoid": (1.0 / 6.0, 0.5),
                        "linear": (1.0, 0.0), "pow": (1.0, 1.0)}
    with pytest.raises(InvalidArgumentError, match="clip needs alpha .* and beta .*: they have no default"):
        EltwiseDesc("clip", src, alpha=-1.0)
    with pytest.raises(InvalidArgumentError, match=r"post_ops\[0\]: clip needs alpha"):
        EltwiseDesc("relu", src, post_ops=(("eltwise", "clip"),))
    x = np.linspace(-5, 5, 41)
    np.testing.assert_allclose(
        eltwise.reference("hardswish", x), x * np.clip(x + 3, 0, 6) / 6, rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(eltwise.reference("soft_relu", x), np.log1p(np.exp(x)), rtol=1e-6)


@pytest.mark.parametrize(
    "alg, params, match",
    [
        ("soft_relu", dict(alpha=0.0), "alpha"),
        ("soft_relu", dict(alpha=-0.0), "alpha"),
        ("hardswish", dict(alpha=None), "alpha"),  # None is no way to ask for the default
        ("elu", dict(alpha=float("nan")), "alpha"),
        ("swish", dict(alpha=float("inf")), "alpha"),
        ("pow", dict(beta=float("-inf")), "beta"),
        ("linear", dict(beta="half"), "beta"),
        ("hardsigmoid", dict(alpha=[0.2]), "alpha"),
        ("clip", dict(alpha=1.0, beta=-1.0), "alpha <= beta"),
    ],
)
def test_bad_parameters(alg, params, match):
    with pytest.raises(InvalidArgumentError, match=match):
        EltwiseDesc(alg, MemoryDesc((8,)), **params)


def test_generator_rejects_zero_alpha_for_soft_relu():
    # The generator takes a descriptor, which refuses the alpha before any source exists.
    with pytest.raises(ValueError, match="alpha"):
        eltwise.generate(
            EltwiseDesc("soft_relu", MemoryDesc((4,)), alpha=0.0),
            KernelConfig(vector_width=4, local_size=4),
        )


async def test_leaky_relu_is_relu(engine, build, upload, rng):
    """leaky_relu is relu with its slope, bit for bit."""
    x = np.concatenate([rng.uniform(-4, 4, 45), SPECIAL]).astype(np.float32)
    d = MemoryDesc(x.shape)
    prims = await build({alg: EltwiseDesc(alg, d, alpha=0.01) for alg in ("relu", "leaky_relu")})
    stream = await engine.stream()
    src = await upload(x)
    got = {}
    for alg, prim in prims.items():
        dst = engine.memory(d)
        await stream.execute(prim, {"src": src, "dst": dst})
        got[alg] = await dst.to_numpy()
    np.testing.assert_array_equal(got["leaky_relu"], got["relu"])
    assert prims["leaky_relu"].label == "eltwise:leaky_relu"


async def test_round_half_to_even(engine, upload):
    """Ties go to the even neighbour, as numpy.rint; -0 and values too large to have a fraction
    come back unchanged."""
    x = np.array(
        [0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 2.4999998, 8388607.5,
         -8388607.5, 8388609.0, 16777217.0, 1e30, -0.0, 0.0, -0.3, np.inf, -np.inf, np.nan, 1.0],
        np.float32,
    )
    got = await run_one(engine, upload, EltwiseDesc("round", MemoryDesc(x.shape)), x)
    np.testing.assert_array_equal(got, np.rint(x))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(np.rint(x)))  # -0.3 and -0 give -0


async def test_soft_relu_far_from_zero(engine, build, upload):
    """Large alpha*x returns x itself (no overflow of exp), large negative alpha*x returns a tiny
    positive value rather than 0 from 1 + e^z rounding to 1; alpha < 0 is defined (logsigmoid-like)."""
    x = np.array([20.0, 50.0, 88.0, 89.0, 100.0, 1e4, 1e30, 3e38, np.inf, -20.0, -50.0, -87.0,
                  -100.0, -1e30, -np.inf, 0.0, 1e-3, -1e-3], np.float32)
    d = MemoryDesc(x.shape)
    params = {"default": {}, "half": dict(alpha=0.5), "negative": dict(alpha=-1.0)}
    prims = await build({name: EltwiseDesc("soft_relu", d, **p) for name, p in params.items()})
    stream = await engine.stream()
    src = await upload(x)
    for name, p in params.items():
        dst = engine.memory(d)
        await stream.execute(prims[name], {"src": src, "dst": dst})
        got = await dst.to_numpy()
        tolerance.check(got, eltwise.reference("soft_relu", x, **p), tolerance.eltwise("soft_relu"))
        if name == "default":
            np.testing.assert_array_equal(got[x >= 20], x[x >= 20])
            small = (x <= -20) & np.isfinite(x) & (x > -87.5)  # e^x still a normal float
            np.testing.assert_allclose(got[small], np.exp(x[small].astype(np.float64)), rtol=1e-5)


async def test_mish_far_from_zero(engine, upload):
    """mish(x) -> x for large x and -> x*e^x (tiny, not 0 or NaN) for large negative x."""
    x = np.array([9.0, 20.0, 21.0, 44.0, 45.0, 89.0, 1e30, 3e38, np.inf, -9.0, -20.0, -40.0, -80.0,
                  -88.0, -1e4, -3e38, 0.0, -0.0, 1e-3], np.float32)
    got = await run_one(engine, upload, EltwiseDesc("mish", MemoryDesc(x.shape)), x)
    tolerance.check(got, eltwise.reference("mish", x), tolerance.eltwise("mish"))
    np.testing.assert_array_equal(got[x >= 20], x[x >= 20])
    tail = (x <= -9) & (x >= -80)
    np.testing.assert_allclose(got[tail], eltwise.reference("mish", x[tail]), rtol=1e-4)
    assert np.all(got[x < -80] <= 0) and not np.any(np.isnan(got))


async def test_elu_and_swish_near_zero_keep_relative_precision(engine, build, upload):
    """elu uses expm1: exp(x) - 1 would keep no digits of alpha*x for |x| ~ 1e-6."""
    x = np.array([-1e-7, -1e-6, -3e-5, -1e-3, -0.1, 1e-7, 1e-6, -1e-20] * 2, np.float32)
    d = MemoryDesc(x.shape)
    prims = await build(
        {"elu": EltwiseDesc("elu", d, alpha=1.5), "swish": EltwiseDesc("swish", d, alpha=2.0)}
    )
    stream = await engine.stream()
    src = await upload(x)
    for alg, params in (("elu", dict(alpha=1.5)), ("swish", dict(alpha=2.0))):
        dst = engine.memory(d)
        await stream.execute(prims[alg], {"src": src, "dst": dst})
        np.testing.assert_allclose(await dst.to_numpy(), eltwise.reference(alg, x, **params), rtol=1e-5)
    elu = eltwise.reference("elu", np.array([-np.inf, -100.0]), alpha=1.5)
    np.testing.assert_array_equal(elu, [-1.5, -1.5])


async def test_hardswish_and_hardsigmoid_saturate_exactly(engine, build, upload):
    """Past the knees the results are exactly 0, 1 or x (hardswish(-inf) is 0, not NaN)."""
    x = np.array([-np.inf, -3e38, -1e30, -4.0, -3.0, -2.9, -1.0, 0.0, -0.0, 1.0, 2.9, 3.0, 4.0,
                  1e30, 3e38, np.inf, np.nan], np.float32)
    d = MemoryDesc(x.shape)
    prims = await build(
        {alg: EltwiseDesc(alg, d, alpha=1 / 6, beta=0.5) for alg in ("hardswish", "hardsigmoid")}
    )
    stream = await engine.stream()
    src = await upload(x)
    for alg in ("hardswish", "hardsigmoid"):
        dst = engine.memory(d)
        await stream.execute(prims[alg], {"src": src, "dst": dst})
        got = await dst.to_numpy()
        tolerance.check(got, eltwise.reference(alg, x, alpha=1 / 6, beta=0.5), tolerance.eltwise(alg))
        low, high = x <= -3, x >= 3
        np.testing.assert_array_equal(got[low], 0.0)
        np.testing.assert_array_equal(got[high], x[high] if alg == "hardswish" else 1.0)
        assert np.isnan(got[-1])


async def test_pow_fractional_and_negative_exponents(engine, build, upload, rng):
    """x**0.5 and x**-1.5 on positive x; negative x gives NaN there, as numpy does; x**0 is 1
    everywhere, NaN included (C's pow)."""
    x = np.concatenate([rng.uniform(0.01, 9, 37), [0.0, np.inf, -2.0, np.nan]]).astype(np.float32)
    d = MemoryDesc(x.shape)
    params = {
        "sqrt": dict(alpha=2.0, beta=0.5), "inv": dict(alpha=1.0, beta=-1.5),
        "zero": dict(alpha=3.0, beta=0.0),
    }
    prims = await build({name: EltwiseDesc("pow", d, **p) for name, p in params.items()})
    stream = await engine.stream()
    src = await upload(x)
    for name, p in params.items():
        dst = engine.memory(d)
        await stream.execute(prims[name], {"src": src, "dst": dst})
        got = await dst.to_numpy()
        tolerance.check(got, eltwise.reference("pow", x, **p), tolerance.eltwise("pow"))
    np.testing.assert_array_equal(got, np.full(x.shape, 3.0, np.float32))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the reference's inf
async def test_reciprocal_and_linear_special_values(engine, build, upload):
    """1/±0 is ±inf, 1/±inf is ±0; linear of ±inf with alpha != 0 is ±inf."""
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0, -4.0, 1e-30, 3e38, 0.1], np.float32)
    d = MemoryDesc(x.shape)
    prims = await build({
        "reciprocal": EltwiseDesc("reciprocal", d),
        "linear": EltwiseDesc("linear", d, alpha=-2.0, beta=1.0),
    })
    stream = await engine.stream()
    src = await upload(x)
    dst = engine.memory(d)
    await stream.execute(prims["reciprocal"], {"src": src, "dst": dst})
    got = await dst.to_numpy()
    tolerance.check(got, eltwise.reference("reciprocal", x), tolerance.eltwise("reciprocal"))
    np.testing.assert_array_equal(got[:4], [np.inf, -np.inf, 0.0, -0.0])
    np.testing.assert_array_equal(np.signbit(got[:4]), [False, True, False, True])
    await stream.execute(prims["linear"], {"src": src, "dst": dst})
    got = await dst.to_numpy()
    tolerance.check(got, eltwise.reference("linear", x, alpha=-2.0, beta=1.0), tolerance.eltwise("linear"))
    np.testing.assert_array_equal(got[2:4], [-np.inf, np.inf])

"""PoolingBackwardDesc: each algorithm against the float64 reference with the registered tolerance
(channels first and last, padding, dilation, 1-3 spatial dims), the reference against a naive loop,
max's tie rule, the narrow storage types, and each error type."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, PoolingBackwardDesc
from triodnn.kernels import kind_of, pooling_bwd, tolerance

ALGS = ("max", "avg_include_padding", "avg_exclude_padding")


def md(dims, dtype="f32", nxc=False) -> MemoryDesc:
    if not nxc:
        return MemoryDesc(tuple(dims), dtype)
    n, c, *spatial = dims
    strides = [0] * len(dims)
    step = 1
    for axis in (1, *range(len(dims) - 1, 1, -1), 0):
        strides[axis] = step
        step *= dims[axis]
    return MemoryDesc(tuple(dims), dtype, tuple(strides))


def _desc(alg, src_dims, dtype="f32", nxc=False, **geometry) -> PoolingBackwardDesc:
    nsp = len(src_dims) - 2
    g = {"padding_l": 0, **geometry}
    kernel, strides = (g["kernel"],) * nsp if isinstance(g["kernel"], int) else g["kernel"], g["strides"]
    strides = (strides,) * nsp if isinstance(strides, int) else strides
    pl = (g["padding_l"],) * nsp if isinstance(g["padding_l"], int) else g["padding_l"]
    pr = g.get("padding_r", pl)
    pr = (pr,) * nsp if isinstance(pr, int) else pr
    dil = g.get("dilation", 1)
    dil = (dil,) * nsp if isinstance(dil, int) else dil
    out = tuple((src_dims[2 + k] + pl[k] + pr[k] - ((kernel[k] - 1) * dil[k] + 1)) // strides[k] + 1
                for k in range(nsp))
    src = md(src_dims, dtype, nxc) if alg == "max" else None
    return PoolingBackwardDesc(alg, md(src_dims[:2] + out, dtype, nxc), md(src_dims, dtype, nxc), src, **g)


async def _run(engine, desc: PoolingBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    args = {name: await engine.from_numpy(array, desc.arg_descs[name]) for name, array in inputs.items()}
    args["diff_src"] = engine.memory(desc.diff_src)
    await (await engine.stream()).execute(primitive, args)
    return await args["diff_src"].to_numpy()


def _inputs(rng, desc: PoolingBackwardDesc, integers: bool = False) -> dict[str, np.ndarray]:
    def values(dims):
        if integers:  # many ties for max
            return rng.integers(-2, 3, dims).astype(np.float32)
        return rng.uniform(-2.0, 2.0, dims).astype(np.float32)

    inputs = {"diff_dst": values(desc.diff_dst.dims)}
    if desc.src is not None:
        inputs["src"] = values(desc.src.dims)
    return inputs


GEOMETRIES = [
    ((2, 3, 9, 8), {"kernel": 3, "strides": 2, "padding_l": 1}),
    ((1, 4, 7, 6), {"kernel": (2, 3), "strides": (2, 1), "padding_l": (0, 1), "padding_r": (1, 2)}),
    ((2, 3, 11), {"kernel": 3, "strides": 2, "padding_l": 2, "dilation": 2}),
    ((1, 2, 5, 6, 4), {"kernel": 2, "strides": 1, "padding_l": 1}),
]


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("nxc", [False, True], ids=["ncx", "nxc"])
@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
async def test_matches_the_reference(engine, rng, alg, nxc, case):
    src_dims, geometry = GEOMETRIES[case]
    desc = _desc(alg, src_dims, nxc=nxc, **geometry)
    inputs = _inputs(rng, desc, integers=case % 2 == 1)
    got = await _run(engine, desc, inputs)
    registered = kind_of(desc)
    tolerance.check(got, registered.reference(desc, inputs), registered.tolerance(desc))


def _naive(alg, dd, src, src_dims, kernel, strides, pl, dil):
    """The definition, one window at a time (2 spatial dims)."""
    out = np.zeros(src_dims)
    n, c, oh, ow = dd.shape
    for b, ch, y, x in itertools.product(range(n), range(c), range(oh), range(ow)):
        taps = [(y * strides[0] - pl[0] + i * dil[0], x * strides[1] - pl[1] + j * dil[1])
                for i in range(kernel[0]) for j in range(kernel[1])]
        inside = [(h, w) for h, w in taps if 0 <= h < src_dims[2] and 0 <= w < src_dims[3]]
        if alg == "max":
            values = [src[b, ch, h, w] for h, w in inside]
            h, w = inside[int(np.argmax(values))]  # argmax: the first maximum
            out[b, ch, h, w] += dd[b, ch, y, x]
        else:
            count = math.prod(kernel) if alg == "avg_include_padding" else len(inside)
            for h, w in inside:
                out[b, ch, h, w] += dd[b, ch, y, x] / count
    return out


@pytest.mark.parametrize("alg", ALGS)
def test_reference_is_the_definition(rng, alg):
    src_dims, kernel, strides, pl, pr, dil = (2, 2, 7, 8), (3, 2), (2, 1), (1, 1), (2, 0), (1, 2)
    desc = PoolingBackwardDesc(alg, md((2, 2, 4, 7)), md(src_dims), md(src_dims) if alg == "max" else None,
                               kernel=kernel, strides=strides, padding_l=pl, padding_r=pr, dilation=dil)
    inputs = _inputs(rng, desc, integers=True)
    want = _naive(alg, inputs["diff_dst"], inputs.get("src"), src_dims, kernel, strides, pl, dil)
    np.testing.assert_allclose(pooling_bwd.desc_reference(desc, inputs), want, rtol=1e-6, atol=1e-6)


async def test_max_ties_go_to_the_first_tap(engine):
    """An all-equal src: every window's gradient lands on its first tap (oneDNN's workspace)."""
    desc = _desc("max", (1, 1, 4, 4), kernel=2, strides=1)
    got = await _run(engine, desc, {"src": np.ones((1, 1, 4, 4), np.float32),
                                    "diff_dst": np.ones((1, 1, 3, 3), np.float32)})
    want = np.zeros((1, 1, 4, 4), np.float32)
    want[0, 0, :3, :3] = 1.0
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("alg", ALGS)
async def test_narrow_types(engine, rng, alg, dtype):
    desc = _desc(alg, (2, 3, 7, 7), dtype=dtype, nxc=True, kernel=3, strides=2, padding_l=1)
    inputs = _inputs(rng, desc, integers=True)
    got = await _run(engine, desc, inputs)
    ulp = {"f16": 2.0**-10, "bf16": 2.0**-7}[dtype]
    tolerance.check(got, kind_of(desc).reference(desc, inputs), ulp)


def test_errors_name_the_culprit():
    dd, ds = md((1, 2, 3, 3)), md((1, 2, 6, 6))
    with pytest.raises(InvalidArgumentError, match="needs the forward's src"):
        PoolingBackwardDesc("max", dd, ds, kernel=2, strides=2, padding_l=0)
    with pytest.raises(InvalidArgumentError, match="takes no src"):
        PoolingBackwardDesc("avg_include_padding", dd, ds, ds, kernel=2, strides=2, padding_l=0)
    with pytest.raises(ArgumentMismatchError, match="diff_dst dims"):
        PoolingBackwardDesc("avg_exclude_padding", md((1, 2, 4, 3)), ds, kernel=2, strides=2, padding_l=0)
    with pytest.raises(ArgumentMismatchError, match="src dims"):
        PoolingBackwardDesc("max", dd, ds, md((1, 2, 6, 7)), kernel=2, strides=2, padding_l=0)
    with pytest.raises(InvalidArgumentError, match="diff_src"):
        PoolingBackwardDesc("max", dd, ds, ds, kernel=(2, 2, 2), strides=2, padding_l=0)
    with pytest.raises(InvalidArgumentError, match="pooling backward"):
        PoolingBackwardDesc("sum", dd, ds, kernel=2, strides=2, padding_l=0)

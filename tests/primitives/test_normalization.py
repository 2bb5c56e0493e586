"""Layer, RMS, batch (inference) and group normalization against the float64 references."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, InvalidArgumentError, MemoryDesc, UnsupportedError
from triodnn._values._normalization_desc import BatchNormInferenceDesc, GroupNormDesc, LayerNormDesc, RMSNormDesc
from triodnn.kernels import normalization, tolerance


def _data(rng, dims, offset=3.0):
    # A nonzero mean, so the two-pass variance matters.
    return (rng.uniform(-2.0, 2.0, dims) + offset).astype(np.float32)


def _vec(rng, c, low=0.5, high=1.5):
    return rng.uniform(low, high, c).astype(np.float32)


async def _run(engine, stream, prim, arrays: dict, descs: dict, out_names):
    """Upload inputs (strides from ``descs``), allocate outputs, execute, return the outputs."""
    mems = {}
    for name, desc in descs.items():
        if name in arrays:
            mems[name] = await engine.from_numpy(arrays[name], desc)
        else:
            mems[name] = engine.memory(desc)
            await mems[name].write(np.full(desc.dims, np.nan, np.float32))
    await stream.execute(prim, mems)
    return {name: await mems[name].to_numpy() for name in out_names}


# name: (dims, axis, src strides, dst strides, scale, shift, stats)
LNORM_CASES = {
    "plain": ((5, 37), -1, None, None, False, False, False),
    "scale_shift_stats": ((3, 4, 33), -1, None, None, True, True, True),
    "scale_only_tnc_to_ntc": ((4, 3, 17), 2, "bac", None, True, False, True),
    "shift_only_strided": ((6, 9), -1, (16, 1), (1, 6), False, True, False),
    "middle_axis": ((3, 7, 5), 1, None, "acb", True, True, True),
    "long_row": ((2, 4099), -1, None, None, True, True, True),
}


async def test_layer_norm(engine, build, rng):
    descs, data = {}, {}
    for name, (dims, axis, s, d, sc, sh, st) in LNORM_CASES.items():
        c = dims[axis]
        stat_dims = tuple(x for i, x in enumerate(dims) if i != axis % len(dims))
        descs[name] = LayerNormDesc(
            MemoryDesc(dims, "f32", s), MemoryDesc(dims, "f32", d), axis=axis, epsilon=1e-4,
            scale=MemoryDesc((c,)) if sc else None, shift=MemoryDesc((c,)) if sh else None,
            mean=MemoryDesc(stat_dims) if st else None, variance=MemoryDesc(stat_dims) if st else None,
        )
        data[name] = {"src": _data(rng, dims)}
        if sc:
            data[name]["scale"] = _vec(rng, c)
        if sh:
            data[name]["shift"] = _vec(rng, c, -1.0, 1.0)
    prims = await build(descs)
    stream = await engine.stream()
    for name, desc in descs.items():
        prim = prims[name]
        assert prim.kind == "layer_normalization"
        assert tuple(desc.arg_descs) == prim.spec.arg_names
        outs = ["dst"] + (["mean", "variance"] if desc.mean is not None else [])
        got = await _run(engine, stream, prim, data[name], desc.arg_descs, outs)
        ref, m, v = normalization.layer_reference(
            data[name]["src"], axis=desc.axis, epsilon=1e-4,
            scale=data[name].get("scale"), shift=data[name].get("shift"),
        )
        try:
            tolerance.check(got["dst"], ref, normalization.LNORM)
            if desc.mean is not None:
                tolerance.check(got["mean"], m, normalization.STATS)
                tolerance.check(got["variance"], v, normalization.STATS)
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None


async def test_rms_norm(engine, build, rng):
    cases = {"plain": ((7, 19), None, False), "scale": ((2, 3, 64), None, True), "strided": ((5, 21), (32, 1), True)}
    descs = {
        name: RMSNormDesc(MemoryDesc(dims, "f32", s), scale=MemoryDesc((dims[-1],)) if sc else None)
        for name, (dims, s, sc) in cases.items()
    }
    prims = await build(descs)
    stream = await engine.stream()
    for name, (dims, _, sc) in cases.items():
        arrays = {"src": _data(rng, dims, 0.5)}
        if sc:
            arrays["scale"] = _vec(rng, dims[-1])
        assert prims[name].kind == "rms_normalization"
        got = await _run(engine, stream, prims[name], arrays, descs[name].arg_descs, ["dst"])
        ref = normalization.rms_reference(arrays["src"], scale=arrays.get("scale"))
        tolerance.check(got["dst"], ref, normalization.RMSNORM)


async def test_batch_norm_inference(engine, build, rng):
    cases = {
        "nc": ((9, 5), None, False, False),
        "nchw_scale_shift": ((2, 3, 5, 7), None, True, True),
        "nhwc_shift": ((2, 4, 3, 5), "nhwc", False, True),
        "ncdhw_scale": ((1, 3, 2, 3, 5), "ndhwc", True, False),
    }
    descs = {
        name: BatchNormInferenceDesc(
            MemoryDesc(dims, "f32", s), MemoryDesc((dims[1],)), MemoryDesc((dims[1],), "f32", (2,)),
            scale=MemoryDesc((dims[1],)) if sc else None, shift=MemoryDesc((dims[1],)) if sh else None,
        )
        for name, (dims, s, sc, sh) in cases.items()
    }
    prims = await build(descs)
    stream = await engine.stream()
    for name, (dims, _, sc, sh) in cases.items():
        c = dims[1]
        arrays = {"src": _data(rng, dims), "mean": _vec(rng, c, 2.0, 4.0), "variance": _vec(rng, c, 0.1, 3.0)}
        if sc:
            arrays["scale"] = _vec(rng, c)
        if sh:
            arrays["shift"] = _vec(rng, c, -1.0, 1.0)
        assert prims[name].kind == "batch_normalization"
        got = await _run(engine, stream, prims[name], arrays, descs[name].arg_descs, ["dst"])
        ref = normalization.batch_reference(
            arrays["src"], arrays["mean"], arrays["variance"], scale=arrays.get("scale"), shift=arrays.get("shift")
        )
        try:
            tolerance.check(got["dst"], ref, normalization.BNORM)
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None


async def test_group_norm(engine, build, rng):
    cases = {
        "nc": ((3, 6), 3, None, False, False),
        "nchw": ((2, 6, 5, 7), 2, None, True, True),
        "nhwc_one_group": ((2, 4, 3, 5), 1, "nhwc", True, False),
        "ncdhw_per_channel": ((1, 3, 2, 3, 5), 3, None, False, True),
        "ncw_strided": ((2, 8, 9), 4, "nwc", True, True),
    }
    descs = {
        name: GroupNormDesc(
            MemoryDesc(dims, "f32", s), g,
            scale=MemoryDesc((dims[1],)) if sc else None, shift=MemoryDesc((dims[1],)) if sh else None,
        )
        for name, (dims, g, s, sc, sh) in cases.items()
    }
    prims = await build(descs)
    stream = await engine.stream()
    for name, (dims, g, _, sc, sh) in cases.items():
        c = dims[1]
        arrays = {"src": _data(rng, dims)}
        if sc:
            arrays["scale"] = _vec(rng, c)
        if sh:
            arrays["shift"] = _vec(rng, c, -1.0, 1.0)
        assert prims[name].kind == "group_normalization"
        got = await _run(engine, stream, prims[name], arrays, descs[name].arg_descs, ["dst"])
        ref = normalization.group_reference(arrays["src"], g, scale=arrays.get("scale"), shift=arrays.get("shift"))
        try:
            tolerance.check(got["dst"], ref, normalization.GNORM)
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None


async def test_in_place(engine, build, rng):
    """src and dst one memory (dst defaults to src's descriptor): the statistics passes only read;
    the writing pass reads each element right before overwriting it, so the result is as out of place."""
    dims = (4, 6, 3, 5)
    src_desc = MemoryDesc(dims, "f32", "nhwc")
    c = MemoryDesc((6,))
    descs = {
        "layer": LayerNormDesc(src_desc, scale=MemoryDesc((5,)), shift=MemoryDesc((5,))),
        "layer_axis1": LayerNormDesc(src_desc, axis=1),
        "rms": RMSNormDesc(src_desc),
        "batch": BatchNormInferenceDesc(src_desc, c, c, scale=c, shift=c),
        "group": GroupNormDesc(src_desc, 3, scale=c),
    }
    prims = await build(descs)
    stream = await engine.stream()
    for name, desc in descs.items():
        assert desc.dst is desc.src
        x = _data(rng, dims)
        memory = await engine.from_numpy(x, src_desc)
        args = {"src": memory, "dst": memory}
        extra = {}
        for arg in ("scale", "shift", "mean", "variance"):
            if arg in desc.arg_descs:
                extra[arg] = _vec(rng, desc.arg_descs[arg].dims[0], 0.5, 2.0)
                args[arg] = await engine.from_numpy(extra[arg])
        await stream.execute(prims[name], args)
        got = await memory.to_numpy()
        if name.startswith("layer"):
            ref = normalization.layer_reference(x, axis=desc.axis, scale=extra.get("scale"), shift=extra.get("shift"))[0]
            threshold = normalization.LNORM
        elif name == "rms":
            ref, threshold = normalization.rms_reference(x), normalization.RMSNORM
        elif name == "batch":
            ref = normalization.batch_reference(x, extra["mean"], extra["variance"], scale=extra["scale"], shift=extra["shift"])
            threshold = normalization.BNORM
        else:
            ref = normalization.group_reference(x, 3, scale=extra["scale"])
            threshold = normalization.GNORM
        try:
            tolerance.check(got, ref, threshold)
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from None


def test_descriptor_values():
    src = MemoryDesc((4, 5, 6))
    assert LayerNormDesc(src) == LayerNormDesc(src, axis=2, epsilon=1e-5)
    assert hash(LayerNormDesc(src, axis=-1)) == hash(LayerNormDesc(src, axis=np.int64(2)))
    assert LayerNormDesc(src, epsilon=0.0) != LayerNormDesc(src, epsilon=-0.0)
    assert LayerNormDesc(src) != LayerNormDesc(src, epsilon=1e-6)
    ln = LayerNormDesc(src, scale=MemoryDesc((6,)), variance=MemoryDesc((4, 5)))
    assert tuple(ln.arg_descs) == ("src", "scale", "variance", "dst")
    assert tuple(LayerNormDesc(src).arg_descs) == ("src", "dst")
    c = MemoryDesc((5,))
    bn = BatchNormInferenceDesc(src, c, c, shift=c)
    assert tuple(bn.arg_descs) == ("src", "shift", "mean", "variance", "dst")
    assert tuple(GroupNormDesc(src, 5, scale=c, shift=c).arg_descs) == ("src", "scale", "shift", "dst")
    assert tuple(RMSNormDesc(src, scale=MemoryDesc((6,))).arg_descs) == ("src", "scale", "dst")
    assert GroupNormDesc(src, 5).label == "group_normalization:g5"


def test_bad_arguments():
    src = MemoryDesc((4, 5, 6))
    with pytest.raises(InvalidArgumentError, match="src"):
        LayerNormDesc(np.zeros((4, 5), np.float32))
    with pytest.raises(InvalidArgumentError, match="src dims"):
        LayerNormDesc(MemoryDesc((6,)))
    with pytest.raises(InvalidArgumentError, match="axis"):
        LayerNormDesc(src, axis=3)
    with pytest.raises(InvalidArgumentError, match="axis"):
        LayerNormDesc(src, axis=1.0)
    with pytest.raises(InvalidArgumentError, match="epsilon"):
        LayerNormDesc(src, epsilon=-1e-5)
    with pytest.raises(InvalidArgumentError, match="epsilon"):
        RMSNormDesc(src, epsilon=float("nan"))
    with pytest.raises(InvalidArgumentError, match="epsilon"):
        GroupNormDesc(src, 5, epsilon="small")
    with pytest.raises(ArgumentMismatchError, match="scale dims"):
        LayerNormDesc(src, scale=MemoryDesc((5,)))
    with pytest.raises(ArgumentMismatchError, match="shift dims"):
        LayerNormDesc(src, shift=MemoryDesc((1, 6)))
    with pytest.raises(ArgumentMismatchError, match="mean dims"):
        LayerNormDesc(src, mean=MemoryDesc((4, 6)))
    with pytest.raises(ArgumentMismatchError, match="variance dims"):
        LayerNormDesc(src, variance=MemoryDesc((20,)))
    with pytest.raises(InvalidArgumentError, match="scale"):
        RMSNormDesc(src, scale=(6,))
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        RMSNormDesc(src, MemoryDesc((4, 6, 5)))
    with pytest.raises(ArgumentMismatchError, match="scale dims"):
        RMSNormDesc(src, scale=MemoryDesc((5,)))
    c = MemoryDesc((5,))
    with pytest.raises(ArgumentMismatchError, match="mean dims"):
        BatchNormInferenceDesc(src, MemoryDesc((6,)), c)
    with pytest.raises(ArgumentMismatchError, match="variance dims"):
        BatchNormInferenceDesc(src, c, MemoryDesc((5, 1)))
    with pytest.raises(InvalidArgumentError, match="mean"):
        BatchNormInferenceDesc(src, None, c)
    with pytest.raises(ArgumentMismatchError, match="shift dims"):
        BatchNormInferenceDesc(src, c, c, shift=MemoryDesc((6,)))
    with pytest.raises(InvalidArgumentError, match="src dims"):
        BatchNormInferenceDesc(MemoryDesc((5,)), c, c)
    for groups in (0, 2, 6, -5):
        with pytest.raises(InvalidArgumentError, match="groups"):
            GroupNormDesc(src, groups)
    for groups in (2.5, True, "5"):
        with pytest.raises(InvalidArgumentError, match="groups"):
            GroupNormDesc(src, groups)
    with pytest.raises(ArgumentMismatchError, match="scale dims"):
        GroupNormDesc(src, 5, scale=MemoryDesc((6,)))


@pytest.mark.parametrize("which", ["scale", "mean"])  # src and dst take any type (test_dtypes_more.py)
async def test_non_f32_is_unsupported(which, engine):
    def md(name, dims):
        return MemoryDesc(dims, "f16" if name == which else "f32")

    dims = (3, 4)
    layer = LayerNormDesc(md("src", dims), md("dst", dims), scale=md("scale", (4,)), mean=md("mean", (3,)))
    with pytest.raises(UnsupportedError, match=f"{which} has dtype 'f16'"):
        await engine.create_primitive(layer)
    batch = BatchNormInferenceDesc(md("src", dims), md("mean", (4,)), MemoryDesc((4,)), md("dst", dims),
                                   scale=md("scale", (4,)))
    with pytest.raises(UnsupportedError, match=f"{which} has dtype 'f16'"):
        await engine.create_primitive(batch)

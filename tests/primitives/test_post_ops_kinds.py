"""Post-op chains and ``output_scale`` on convolution, softmax and the normalizations, and
``output_scale`` on matmul (whose post-ops tests/primitives/test_post_ops.py covers).

Each chain has an eltwise (a transcendental where the threshold allows), a sum with a scale
(dst filled beforehand, so the kernel must read it before its store) and a binary post-op with a
broadcast operand. ``output_scale`` multiplies the result before the chain; the kernels get it as
a leading ``linear`` eltwise, so the binary operands keep the user's indices in their names.
Convolution and matmul inputs are small integers (exact sums): a scale of 0.5 alone compares
exactly.
"""

from __future__ import annotations

import functools

import attrs
import numpy as np
import pytest
from _sweeps import (
    CPU,
    VARIANTS,
    add_sum_eltwise,
    assert_refused_caching_nothing,
    execute,
    execute_in_place,
    normal,
    post_op_inputs,
    post_op_variant,
    threshold,
)
from _sweeps import ints as _ints

import triodnn
from triodnn import (
    BatchNormInferenceDesc,
    ConvolutionDesc,
    GroupNormDesc,
    LayerNormDesc,
    MatmulDesc,
    MemoryDesc,
    RMSNormDesc,
    SoftmaxDesc,
)
from triodnn.kernels import _post_ops, convolution, matmul, normalization, softmax, tolerance

ints = functools.partial(_ints, bound=3)  # [-3, 3]


# Convolution ---------------------------------------------------------------------------------

# name: (src dims, OC, src layout, impl prefix)
CONV_CASES = {
    # 37 outputs along W: 16-lane blocks, the last one shifted left.
    "row16": ((2, 3, 6, 37), 5, None, "ocl:direct:row16:oc5:h1"),
    # Two output channels: blocks of 4 rows (h4), the last shifted up to end at the last row.
    "row16-four-rows": ((1, 3, 7, 20), 2, None, "ocl:direct:row16:oc2:h4"),
    # Fewer than 16 outputs along W; 17 channels: a channel block with per-channel checks.
    "per-position": ((2, 3, 7, 9), 17, None, "ocl:direct:oc16"),
    # nhwc: src not contiguous along W.
    "per-position-nhwc": ((1, 4, 6, 20), 6, "nhwc", "ocl:direct:oc6"),
}


def conv_variant(variant: str, dst_dims: tuple[int, ...]) -> tuple[float, tuple]:
    n, oc, oh, ow = dst_dims
    # scale+chain: an operand varying along H and W, gathered lane by lane on the row path.
    scaled = (-0.25, (("sum", 2.0), ("binary", "mul", MemoryDesc((1, 1, oh, ow))), ("eltwise", "gelu_erf")))
    return post_op_variant(variant, add_sum_eltwise((1, oc, 1, 1), "tanh"), 0.5, scaled)


@pytest.mark.parametrize(
    "case, variant",
    [(case, v) for case in ("row16", "per-position") for v in ("chain", "scale", "scale+chain")]
    + [("row16-four-rows", "scale+chain"), ("per-position-nhwc", "chain"), ("row16-four-rows", "chain")],
)
async def test_convolution(engine, rng, case, variant):
    src_dims, oc, layout, impl = CONV_CASES[case]
    src_md = MemoryDesc(src_dims, "f32", layout) if layout else MemoryDesc(src_dims)
    plain = ConvolutionDesc(src_md, MemoryDesc((oc, src_dims[1], 3, 3)), bias=MemoryDesc((oc,)), padding_l=1)
    output_scale, chain = conv_variant(variant, plain.dst.dims)
    desc = ConvolutionDesc(plain.src, plain.weights, bias=plain.bias, padding_l=1, post_ops=chain,
                           output_scale=output_scale)
    spec = convolution.generate(desc, CPU)
    assert spec.impl.startswith(impl)
    assert spec.arg_names == tuple(desc.arg_descs)
    x, w, b = ints(rng, src_dims), ints(rng, desc.weights.dims), ints(rng, (oc,))
    operands, old = post_op_inputs(rng, desc, ints)
    got = await execute(engine, desc, {"src": x, "weights": w, "bias": b, **operands}, dst_init=old)
    ref = convolution.reference(x, w, b, padding_l=(1, 1), output_scale=output_scale, post_ops=desc.post_ops,
                                old_dst=old, operands=operands)
    tolerance.check(got, ref, threshold(0.0, desc.post_ops))  # exact but for the eltwise post-ops


# Softmax -------------------------------------------------------------------------------------

# name: (dims, axis, impl)
SOFTMAX_CASES = {
    "vector": ((6, 64), -1, "ocl:row:v16"),
    "scalar": ((5, 37), -1, "ocl:row:v1l"),
    "scalar-middle-axis": ((4, 37, 3), 1, "ocl:row:v1l"),
}


def softmax_variant(variant: str, dims: tuple[int, ...], axis: int) -> tuple[float, tuple]:
    along_axis = tuple(d if i == axis % len(dims) else 1 for i, d in enumerate(dims))  # one row for all rows
    per_row = tuple(1 if i == axis % len(dims) else d for i, d in enumerate(dims))  # one value per row
    scaled = (0.75, (("binary", "mul", MemoryDesc(per_row)), ("eltwise", "sigmoid"), ("sum", -1.5)))
    return post_op_variant(variant, add_sum_eltwise(along_axis, "exp"), 3.0, scaled)


@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
@pytest.mark.parametrize(
    "alg, variant",
    [("softmax", "chain"), ("logsoftmax", "chain"), ("softmax", "scale"), ("softmax", "scale+chain"),
     ("logsoftmax", "scale+chain")],
)
async def test_softmax(engine, rng, case, alg, variant):
    dims, axis, impl = SOFTMAX_CASES[case]
    output_scale, chain = softmax_variant(variant, dims, axis)
    desc = SoftmaxDesc(alg, MemoryDesc(dims), axis=axis, post_ops=chain, output_scale=output_scale)
    spec = softmax.generate(desc, CPU)
    assert spec.impl.startswith(impl)
    assert spec.arg_names == tuple(desc.arg_descs)
    x = normal(rng, dims) * 3
    operands, old = post_op_inputs(rng, desc)
    got = await execute(engine, desc, {"src": x, **operands}, dst_init=old)
    ref = softmax.reference(alg, x, axis=axis, output_scale=output_scale, post_ops=desc.post_ops,
                            old_dst=old, operands=operands)
    tolerance.check(got, ref, threshold(tolerance.softmax(alg), desc.post_ops))


@pytest.mark.parametrize("dims", [(6, 64), (5, 37)])
async def test_softmax_in_place_sum_adds_src(engine, rng, dims):
    """In place, dst's old values are src's: each is read before its own store."""
    chain = (("sum", 1.0),)
    desc = SoftmaxDesc("softmax", MemoryDesc(dims), post_ops=chain, output_scale=2.0)
    x = normal(rng, dims)
    got = await execute_in_place(engine, desc, x)
    ref = softmax.reference("softmax", x, output_scale=2.0, post_ops=chain, old_dst=x)
    tolerance.check(got, ref, 4 * tolerance.SOFTMAX)


# Normalizations ------------------------------------------------------------------------------


def norm_case(kind: str, rng, layout: str | None = None):
    """(descriptor without post-ops, input arrays, a broadcast operand's dims, reference function)."""
    if kind == "layer":
        dims = (5, 3, 37)
        stats = MemoryDesc(dims[:-1])
        plain = LayerNormDesc(MemoryDesc(dims), scale=MemoryDesc((37,)), shift=MemoryDesc((37,)),
                              mean=stats, variance=stats)
        arrays = {"src": normal(rng, dims) + 1, "scale": normal(rng, 37), "shift": normal(rng, 37)}
        return plain, arrays, (37,), lambda a, **kw: normalization.layer_reference(
            a["src"], scale=a["scale"], shift=a["shift"], **kw)[0]
    if kind == "rms":
        dims = (4, 64)
        plain = RMSNormDesc(MemoryDesc(dims), scale=MemoryDesc((64,)))
        arrays = {"src": normal(rng, dims), "scale": normal(rng, 64)}
        return plain, arrays, (4, 1), lambda a, **kw: normalization.rms_reference(a["src"], scale=a["scale"], **kw)
    c = 4
    dims = (2, c, 3, 5)
    src = MemoryDesc(dims, "f32", layout) if layout else MemoryDesc(dims)
    if kind == "batch":
        plain = BatchNormInferenceDesc(src, MemoryDesc((c,)), MemoryDesc((c,)), scale=MemoryDesc((c,)),
                                       shift=MemoryDesc((c,)))
        arrays = {"src": normal(rng, dims), "mean": normal(rng, c), "variance": rng.uniform(0.5, 2, c).astype(np.float32),
                  "scale": normal(rng, c), "shift": normal(rng, c)}
        return plain, arrays, (1, c, 1, 1), lambda a, **kw: normalization.batch_reference(
            a["src"], a["mean"], a["variance"], scale=a["scale"], shift=a["shift"], **kw)
    plain = GroupNormDesc(src, 2, scale=MemoryDesc((c,)), shift=MemoryDesc((c,)))
    arrays = {"src": normal(rng, dims), "scale": normal(rng, c), "shift": normal(rng, c)}
    return plain, arrays, (1, c, 1, 1), lambda a, **kw: normalization.group_reference(
        a["src"], 2, scale=a["scale"], shift=a["shift"], **kw)


NORM_TOLERANCE = {
    "layer": normalization.LNORM, "rms": normalization.RMSNORM, "batch": normalization.BNORM,
    "group": normalization.GNORM,
}


@pytest.mark.parametrize("kind", list(NORM_TOLERANCE))
@pytest.mark.parametrize("variant", VARIANTS)
async def test_normalization(engine, rng, kind, variant):
    plain, arrays, operand_dims, reference = norm_case(kind, rng)
    scaled = (0.3, (("eltwise", "clip", -1.0, 1.5), ("sum", 1.0), ("binary", "max", MemoryDesc(operand_dims)),
                    ("eltwise", "log")))
    # scale alone: a power of two, so the product is exact
    output_scale, chain = post_op_variant(variant, add_sum_eltwise(operand_dims, "gelu_tanh"), -2.0, scaled)
    desc = attrs.evolve(plain, post_ops=chain, output_scale=output_scale)
    assert triodnn.kernels.generate(desc, CPU).arg_names == tuple(desc.arg_descs)
    operands, old = post_op_inputs(rng, desc)
    if variant == "scale+chain":  # log needs positive values: max with a positive operand
        operands = {name: np.abs(v) + 0.5 for name, v in operands.items()}
    got = await execute(engine, desc, {**arrays, **operands}, dst_init=old)
    ref = reference(arrays, output_scale=output_scale, post_ops=desc.post_ops, old_dst=old, operands=operands)
    tolerance.check(got, ref, threshold(NORM_TOLERANCE[kind], desc.post_ops))


@pytest.mark.parametrize("kind", ["batch", "group"])
async def test_normalization_nhwc_with_a_full_operand(engine, rng, kind):
    plain, arrays, _, reference = norm_case(kind, rng, layout="nhwc")
    full = MemoryDesc(plain.dst.dims, "f32", "nchw")  # laid out unlike src and dst
    chain = (("sum", 0.25), ("binary", "sub", full), ("eltwise", "tanh"))
    desc = attrs.evolve(plain, post_ops=chain, output_scale=1.5)
    operand = normal(rng, full.dims)
    old = normal(rng, desc.dst.dims)
    got = await execute(engine, desc, {**arrays, "post_op_1_src1": operand}, dst_init=old)
    ref = reference(arrays, output_scale=1.5, post_ops=desc.post_ops, old_dst=old, operands={1: operand})
    tolerance.check(got, ref, threshold(NORM_TOLERANCE[kind], chain))


async def test_layer_norm_in_place_sum_adds_src(engine, rng):
    x = normal(rng, (6, 33))
    chain = (("sum", -1.0),)
    desc = LayerNormDesc(MemoryDesc(x.shape), post_ops=chain, output_scale=0.5)
    got = await execute_in_place(engine, desc, x)
    ref = normalization.layer_reference(x, output_scale=0.5, post_ops=chain, old_dst=x)[0]
    tolerance.check(got, ref, 4 * normalization.LNORM)


# Matmul: output_scale (its kernel takes the scale as a leading linear eltwise) --------------


async def test_matmul_output_scale_alone(engine, rng):
    a, w, b = ints(rng, (33, 20)), ints(rng, (20, 40)), ints(rng, (1, 40))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), bias=MemoryDesc(b.shape), output_scale=0.5)
    got = await execute(engine, desc, {"src": a, "weights": w, "bias": b})
    np.testing.assert_array_equal(got, matmul.reference(a, w, b) * 0.5)


@pytest.mark.parametrize("m, n", [(32, 48), (17, 23)])
async def test_matmul_output_scale_keeps_the_operand_names(engine, rng, m, n):
    """Two binary operands around a sum: their names keep the user's indices, 0 and 2."""
    a, w = ints(rng, (m, 9)), ints(rng, (9, n))
    row, col, old = ints(rng, (1, n)), ints(rng, (m, 1)), ints(rng, (m, n))
    chain = (("binary", "add", MemoryDesc((1, n))), ("sum", 2.0), ("binary", "mul", MemoryDesc((m, 1))),
             ("eltwise", "relu"))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), post_ops=chain, output_scale=-1.5)
    spec = matmul.generate(desc, CPU)
    assert spec.arg_names == ("src", "weights", "post_op_0_src1", "post_op_2_src1", "dst")
    got = await execute(engine, desc, {"src": a, "weights": w, "post_op_0_src1": row, "post_op_2_src1": col},
                        dst_init=old)
    ref = _post_ops.scaled_reference(chain, matmul.reference(a, w), old, {0: row, 2: col}, output_scale=-1.5)
    np.testing.assert_array_equal(got, ref)  # small integers and halves: exact
    np.testing.assert_array_equal(got, np.maximum((a @ w * -1.5 + row + 2.0 * old) * col, 0))


# Descriptors: equality, cache blobs, errors --------------------------------------------------


def make(kind: str, **attrs):
    """A small descriptor of ``kind`` (dst dims ending in 8), with the given attributes."""
    if kind == "matmul":
        return MatmulDesc(MemoryDesc((4, 3)), MemoryDesc((3, 8)), **attrs)
    if kind == "convolution":
        return ConvolutionDesc(MemoryDesc((1, 2, 4, 8)), MemoryDesc((4, 2, 1, 1)), **attrs)
    if kind == "softmax":
        return SoftmaxDesc("logsoftmax", MemoryDesc((4, 8)), **attrs)
    if kind == "layer":
        return LayerNormDesc(MemoryDesc((4, 8)), **attrs)
    if kind == "rms":
        return RMSNormDesc(MemoryDesc((4, 8)), **attrs)
    if kind == "batch":
        return BatchNormInferenceDesc(MemoryDesc((2, 4, 8)), MemoryDesc((4,)), MemoryDesc((4,)), **attrs)
    return GroupNormDesc(MemoryDesc((2, 4, 8)), 2, **attrs)


KINDS = ["matmul", "convolution", "softmax", "layer", "rms", "batch", "group"]


@pytest.mark.parametrize("kind", KINDS)
def test_output_scale_and_post_ops_are_part_of_the_value(kind):
    assert make(kind) == make(kind, output_scale=1) == make(kind, output_scale="1.0", post_ops=[])
    assert make(kind).output_scale == 1.0 and isinstance(make(kind, output_scale=2).output_scale, float)
    assert hash(make(kind, output_scale=2)) == hash(make(kind, output_scale=2.0))
    assert make(kind, output_scale=2.0) != make(kind)
    assert make(kind, output_scale=0.0) != make(kind, output_scale=-0.0)  # different kernel literals
    chain = [("eltwise", "relu")]
    assert make(kind, post_ops=chain) == make(kind, post_ops=(("eltwise", "relu", 0.0, 0.0),))
    assert make(kind, post_ops=chain) != make(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_scaled_chain_names_operands_by_the_users_index(kind):
    chain = (("eltwise", "abs"), ("binary", "add", MemoryDesc((8,))), ("binary", "min", MemoryDesc((1,))))
    plain = make(kind, post_ops=chain)
    scaled = make(kind, post_ops=chain, output_scale=0.5)
    assert tuple(scaled.arg_descs)[-3:-1] == ("post_op_1_src1", "post_op_2_src1")
    scaled_spec, plain_spec = triodnn.kernels.generate(scaled, CPU), triodnn.kernels.generate(plain, CPU)
    assert scaled_spec.arg_names == plain_spec.arg_names == tuple(scaled.arg_descs)
    # The scale is a leading linear eltwise, so abs moves from post_op_0_* to post_op_1_*.
    assert "post_op_1_float" in scaled_spec.source and "post_op_1_float" not in plain_spec.source


@pytest.mark.parametrize("kind, operand_dims", [("convolution", (1, 4, 1, 1)), ("group", (1, 4, 1))])
async def test_cache_blob_round_trips_output_scale_and_post_ops(engine, rng, kind, operand_dims):
    chain = (("binary", "add", MemoryDesc(operand_dims)), ("sum", 0.25), ("eltwise", "linear", 2.0, -1.0))
    output_scale = 0.75 if kind == "convolution" else -0.0
    desc = make(kind, post_ops=chain, output_scale=output_scale)
    primitive = await engine.create_primitive(desc)
    loaded = await engine.create_primitive_from_cache_blob(primitive.cache_blob())
    assert loaded.desc == desc and loaded.spec == primitive.spec
    assert isinstance(loaded.desc.post_ops[0][2], MemoryDesc)
    assert str(loaded.desc.output_scale) == str(output_scale)  # -0.0 keeps its sign
    arrays = {name: ints(rng, md.dims) for name, md in desc.arg_descs.items() if name != "dst"}
    old = ints(rng, desc.dst.dims)
    got = await execute(engine, loaded.desc, arrays, dst_init=old, primitive=loaded)
    if kind == "convolution":
        result = convolution.reference(arrays["src"], arrays["weights"])
    else:
        result = normalization.group_reference(arrays["src"], 2)
    ref = _post_ops.scaled_reference(chain, result, old, {0: arrays["post_op_0_src1"]}, output_scale=output_scale)
    tolerance.check(got, ref, normalization.GNORM)


@pytest.mark.parametrize("kind", KINDS)
def test_operand_that_does_not_broadcast_names_the_entry(kind):
    chain = (("eltwise", "relu"), ("binary", "add", MemoryDesc((3,))))
    with pytest.raises(triodnn.ArgumentMismatchError, match=r"post_ops\[1\]: src1 dims \(3,\) do not broadcast"):
        make(kind, post_ops=chain)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "value, message",
    [(float("nan"), "output_scale nan must be finite"), (float("inf"), "output_scale inf must be finite"),
     (-float("inf"), "output_scale -inf must be finite"), ("big", "output_scale 'big' is not a number"),
     (None, "output_scale None is not a number")],
)
def test_bad_output_scale_is_refused_by_name(kind, value, message):
    with pytest.raises(triodnn.InvalidArgumentError, match=message):
        make(kind, output_scale=value)


@pytest.mark.parametrize("kind", KINDS)
async def test_failed_create_caches_nothing(engine, kind):
    """An unsupported operand dtype fails in create_primitive, before the cache is consulted."""
    desc = make(kind, post_ops=(("binary", "add", MemoryDesc((8,), "f16")),), output_scale=2.0)
    await assert_refused_caching_nothing(engine, desc, "post_op_0_src1")

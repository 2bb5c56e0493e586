"""The CPU configuration's float-vector row path of layer and RMS normalization (``ocl:row:vN``):
lengths that tile by 16 and by smaller vectors only, scale/shift, statistics, several rows per
work-item, post-ops with per-element and broadcast operands, output_scale, non-f32 storage."""

from __future__ import annotations

import numpy as np
import pytest
from _sweeps import CPU, add_sum_eltwise, execute, normal, post_op_inputs, threshold

from triodnn import MemoryDesc
from triodnn._values._normalization_desc import LayerNormDesc, RMSNormDesc
from triodnn.kernels import generate, normalization, select_config, tolerance


def _src(rng, dims, offset=1.0):
    return (rng.uniform(-2.0, 2.0, dims) + offset).astype(np.float32)


# dims, expected impl prefix (v16: rows divide by 16; v8/v2: only by smaller vectors; v1: odd).
LAYER_CASES = {
    "v16_long": ((3, 4096), "ocl:row:v16"),
    "v16_short_rows": ((300, 32), "ocl:row:v16"),
    "v8": ((7, 40), "ocl:row:v8"),
    "v2_even": ((5, 34), "ocl:row:v2"),
    "odd_scalar": ((5, 33), "ocl:row:v1"),
}


@pytest.mark.parametrize("case", list(LAYER_CASES))
@pytest.mark.parametrize("affine", [False, True])
async def test_layer_norm_vector_path(engine, rng, case, affine):
    dims, impl = LAYER_CASES[case]
    c = dims[-1]
    stats = MemoryDesc(dims[:-1])
    desc = LayerNormDesc(MemoryDesc(dims), epsilon=1e-4, scale=MemoryDesc((c,)) if affine else None,
                         shift=MemoryDesc((c,)) if affine else None, mean=stats, variance=stats)
    assert generate(desc, CPU).impl.startswith(impl)
    arrays = {"src": _src(rng, dims)}
    if affine:
        arrays["scale"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        arrays["shift"] = rng.uniform(-1.0, 1.0, c).astype(np.float32)
    got = await execute(engine, desc, arrays, outputs=("dst", "mean", "variance"))
    ref, m, v = normalization.layer_reference(arrays["src"], epsilon=1e-4, scale=arrays.get("scale"),
                                              shift=arrays.get("shift"))
    tolerance.check(got["dst"], ref, normalization.LNORM)
    tolerance.check(got["mean"], m, normalization.STATS)
    tolerance.check(got["variance"], v, normalization.STATS)


async def test_rows_per_work_item_and_gpu_config_unchanged(engine, rng):
    """Rows of 32: four per work-item (``r4``), each row's dst and statistics against the
    reference (a row index off by one there leaves a quarter of the rows wrong); the GPU
    configuration keeps its own paths."""
    engine._config = CPU  # the CPU configuration's path, whichever device the default engine is
    dims = (4096, 32)
    stats = MemoryDesc(dims[:-1])
    layer = LayerNormDesc(MemoryDesc(dims), epsilon=1e-3, scale=MemoryDesc((32,)), shift=MemoryDesc((32,)),
                          mean=stats, variance=stats)
    rms = RMSNormDesc(MemoryDesc(dims), epsilon=1e-3, scale=MemoryDesc((32,)), rrms=stats)
    arrays = {"src": _src(rng, dims), "scale": rng.uniform(0.5, 1.5, 32).astype(np.float32),
              "shift": rng.uniform(-1.0, 1.0, 32).astype(np.float32)}
    for desc in (layer, rms):
        assert (await engine.create_primitive(desc)).impl == "ocl:row:v16l16r4"
    got = await execute(engine, layer, arrays, outputs=("dst", "mean", "variance"))
    ref, m, v = normalization.layer_reference(arrays["src"], epsilon=1e-3, scale=arrays["scale"],
                                              shift=arrays["shift"])
    tolerance.check(got["dst"], ref, normalization.LNORM)
    tolerance.check(got["mean"], m, normalization.STATS)
    tolerance.check(got["variance"], v, normalization.STATS)
    got = await execute(engine, rms, {"src": arrays["src"], "scale": arrays["scale"]}, outputs=("dst", "rrms"))
    tolerance.check(got["dst"], normalization.rms_reference(arrays["src"], epsilon=1e-3, scale=arrays["scale"]),
                    normalization.RMSNORM)
    tolerance.check(got["rrms"], normalization.rms_statistics_reference(arrays["src"], epsilon=1e-3),
                    normalization.STATS)
    gpu = select_config("gpu", 1024)
    assert generate(LayerNormDesc(MemoryDesc((8, 1024))), gpu).impl.startswith("ocl:wg_row:")
    assert generate(RMSNormDesc(MemoryDesc((8, 16))), gpu).impl == f"ocl:row:v1l{gpu.local_size}"


@pytest.mark.parametrize("dims", [(3, 2, 48), (5, 16), (6, 24)])
async def test_rms_norm_vector_path(engine, rng, dims):
    desc = RMSNormDesc(MemoryDesc(dims), scale=MemoryDesc((dims[-1],)))
    assert generate(desc, CPU).impl.startswith("ocl:row:v") and not generate(desc, CPU).impl.startswith("ocl:row:v1l")
    arrays = {"src": _src(rng, dims, 0.5), "scale": rng.uniform(0.5, 1.5, dims[-1]).astype(np.float32)}
    got = await execute(engine, desc, arrays)
    tolerance.check(got, normalization.rms_reference(arrays["src"], scale=arrays["scale"]), normalization.RMSNORM)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("operand", ["full", "row_bcast", "col_bcast"])
async def test_vector_path_post_ops(engine, rng, kind, operand):
    dims = (6, 64)
    operand_dims = {"full": dims, "row_bcast": (1, 64), "col_bcast": (6, 1)}[operand]
    chain = add_sum_eltwise(operand_dims, "gelu_erf")
    if kind == "layer":
        desc = LayerNormDesc(MemoryDesc(dims), scale=MemoryDesc((64,)), shift=MemoryDesc((64,)), post_ops=chain,
                             output_scale=0.75)
        arrays = {"src": normal(rng, dims) + 1, "scale": normal(rng, 64), "shift": normal(rng, 64)}
    else:
        desc = RMSNormDesc(MemoryDesc(dims), scale=MemoryDesc((64,)), post_ops=chain, output_scale=0.75)
        arrays = {"src": normal(rng, dims), "scale": normal(rng, 64)}
    assert generate(desc, CPU).impl.startswith("ocl:row:v16")
    operands, old = post_op_inputs(rng, desc)
    got = await execute(engine, desc, {**arrays, **operands}, dst_init=old)
    kw = dict(output_scale=0.75, post_ops=desc.post_ops, old_dst=old, operands=operands)
    if kind == "layer":
        ref = normalization.layer_reference(arrays["src"], scale=arrays["scale"], shift=arrays["shift"], **kw)[0]
    else:
        ref = normalization.rms_reference(arrays["src"], scale=arrays["scale"], **kw)
    tolerance.check(got, ref, threshold(normalization.LNORM, desc.post_ops))

"""The int8 tensor-core matmul (kernels/quantized_matmul_mma.py): which problems it takes, and
its results.

Generation is checked everywhere; the kernels run only on an NVIDIA device of sm_80 or later,
where ``quantized_matmul.generate`` hands them every int8 matmul they can read. Sums are exact
integers and the epilogue is the other int8 kernels', so results must equal
``quantized_matmul.reference`` exactly: over the full u8/s8 ranges, zero points on either side
or both (the compensation sums), per-channel ones, both weights layouts (N-contiguous through
the byte-transposing fragments), edges in M and N, a K tail and batches.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from _gpu_matmul import run_spec

from triodnn import MemoryDesc, QuantizedMatmulDesc
from triodnn.kernels import quantized_matmul, quantized_matmul_mma, select_config

SM90 = select_config("gpu", 1024, 48 * 1024, nvidia_sm=90)
NO_TENSOR_CORES = select_config("gpu", 1024, 48 * 1024)


def md(*dims, dtype="u8", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


def ints(rng, dtype, shape) -> np.ndarray:
    low, high = (-128, 128) if dtype == "s8" else (0, 256)
    return rng.integers(low, high, shape).astype(np.int8 if dtype == "s8" else np.uint8)


@pytest.fixture
def tensor_cores(engine):
    if engine.info.nvidia_sm < quantized_matmul_mma.MIN_SM:
        pytest.skip(f"the tensor-core kernels need an NVIDIA device of sm_{quantized_matmul_mma.MIN_SM}+; "
                    f"this is {engine}")
    return engine


def test_it_takes_int8_in_layouts_it_reads():
    takes = lambda desc, config=SM90: quantized_matmul_mma.applies(desc, config)  # noqa: E731
    assert takes(QuantizedMatmulDesc(md(64, 64), md(64, 64, dtype="s8")))
    assert takes(QuantizedMatmulDesc(md(3, 40, 80, dtype="s8"), md(80, 32, dtype="s8", strides="ba")))
    refused = {
        "another vendor": (QuantizedMatmulDesc(md(64, 64), md(64, 64, dtype="s8")), NO_TENSOR_CORES),
        "before sm_80": (QuantizedMatmulDesc(md(64, 64), md(64, 64, dtype="s8")), attrs.evolve(SM90, nvidia_sm=75)),
        "K not whole chunks": (QuantizedMatmulDesc(md(64, 40), md(40, 64, dtype="s8")), SM90),
        "N not whole chunks, N contiguous": (QuantizedMatmulDesc(md(64, 64), md(64, 40, dtype="s8")), SM90),
        "src K-strided": (QuantizedMatmulDesc(md(64, 64, strides="ba"), md(64, 64, dtype="s8")), SM90),
        "rows not 16-byte aligned": (QuantizedMatmulDesc(md(64, 64, strides=(72, 1)), md(64, 64, dtype="s8")), SM90),
        "dst under 16 rows": (QuantizedMatmulDesc(md(8, 64), md(64, 64, dtype="s8")), SM90),
    }
    assert {why for why, (desc, config) in refused.items() if takes(desc, config)} == set()
    big = QuantizedMatmulDesc(md(4096, 4096), md(4096, 4096, dtype="s8"))
    assert quantized_matmul_mma.choose_tile(4096, 4096, 1, SM90).name == "128x128x64:w2x4:p2"
    spec = quantized_matmul.generate(big, SM90, mma_tile="128x128x64:w2x4:p2")
    assert spec.impl == "ocl:int8:mma:128x128x64:w2x4:p2" and spec.local_size == (256, 1, 1)
    assert "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32" in spec.source
    # Chosen by itself only once measured on a GPU (quantized_matmul_mma.CHOSEN).
    assert quantized_matmul.generate(big, SM90).impl.startswith("ocl:int8:mma:") is quantized_matmul_mma.CHOSEN
    assert not quantized_matmul.generate(QuantizedMatmulDesc(md(64, 64), md(64, 64, dtype="s8")),
                                         NO_TENSOR_CORES).impl.startswith("ocl:int8:mma:")


def test_tiles_and_the_sums_only_zero_points_need():
    for tile in quantized_matmul_mma.TILES.values():
        tile.check()
        assert max(tile.local_bytes(True), tile.local_bytes(False)) <= 48 * 1024 - 64
    with pytest.raises(ValueError, match="int8 tensor-core tile 256x256x64:w2x2:p2 does not fit"):
        quantized_matmul_mma.MmaTile(256, 256, 64, 2, 2, elem_bytes=1).check()
    tile = "64x64x64:w2x2:p2"
    plain = quantized_matmul.generate(QuantizedMatmulDesc(md(64, 64), md(64, 64, dtype="s8")), SM90,
                                      mma_tile=tile).source
    both = quantized_matmul.generate(QuantizedMatmulDesc(md(64, 64), md(64, 64, dtype="s8"), src_zp=3, wei_zps=[1]),
                                     SM90, mma_tile=tile).source
    assert "ONES, ONES, ONES, ONES" not in plain and "ONES, ONES);" not in plain
    assert "ONES, ONES, ONES, ONES" in both and "ONES, ONES);" in both


def _desc(src_t, wei_t, dst_t, shape, *, transposed, src_zp, wei_zps, per_channel, post_ops=()):
    batch, m, k, n = shape
    # Transposed: K fastest, then N, then the batch dims (a linear layer's N x K weights).
    strides = tuple(k * n * int(np.prod(batch[i + 1:], dtype=np.int64)) for i in range(len(batch))) + (1, k)
    wei = md(*batch, k, n, dtype=wei_t, strides=strides if transposed else None)
    scales = [0.02 * (1 + i % 5) for i in range(n)] if per_channel else [0.02]
    return QuantizedMatmulDesc(md(*batch, m, k, dtype=src_t), wei, md(*batch, m, n, dtype=dst_t),
                               bias=md(1, n, dtype="f32"), src_scale=0.01, src_zp=src_zp, wei_scales=scales,
                               wei_zps=wei_zps, dst_scale=0.5 if dst_t in ("s8", "u8") else 1.0,
                               dst_zp=4 if dst_t == "u8" else 0, post_ops=post_ops)


def _inputs(rng, desc):
    return {"src": ints(rng, desc.src.dtype, desc.src.dims),
            "weights": ints(rng, desc.weights.dtype, desc.weights.dims),
            "bias": rng.normal(size=desc.bias.dims).astype(np.float32)}


def _stored(desc, arrays):
    """Arrays as the kernel reads them: the weights in their (maybe transposed) strides."""
    out = dict(arrays)
    w, strides = arrays["weights"], desc.weights.strides
    order = sorted(range(w.ndim), key=lambda d: -strides[d])
    out["weights"] = np.ascontiguousarray(w.transpose(order))
    return out


@pytest.mark.parametrize("tile", list(quantized_matmul_mma.TILES))
@pytest.mark.parametrize("transposed", [False, True])
async def test_every_tile_in_both_weights_layouts(tensor_cores, rng, tile, transposed):
    """Edges in M and N, a K tail (K = 80: a slab and a quarter), both zero points."""
    desc = _desc("u8", "s8", "f32", ((2,), 150, 80, 144), transposed=transposed, src_zp=3, wei_zps=[-2],
                 per_channel=False)
    arrays = _inputs(rng, desc)
    spec = quantized_matmul.generate(desc, tensor_cores.kernel_config, mma_tile=tile)
    assert spec.impl == f"ocl:int8:mma:{tile}"
    got = run_spec(tensor_cores, spec, _stored(desc, arrays), desc.dst.dims)
    np.testing.assert_array_equal(got, quantized_matmul.reference(desc, arrays))


@pytest.mark.parametrize("src_t, wei_t, dst_t, src_zp, wei_zps, per_channel", [
    ("u8", "s8", "u8", 0, [], False),        # no zero points: no compensation sums
    ("u8", "s8", "s8", 128, [], True),       # src's only: the weights' column sums
    ("s8", "s8", "f32", 0, [3], True),       # the weights' only: src's row sums
    ("s8", "u8", "s8", -5, list(range(-24, 24)), True),  # both, per channel
])
@pytest.mark.parametrize("transposed", [False, True])
async def test_types_and_zero_points(tensor_cores, rng, src_t, wei_t, dst_t, src_zp, wei_zps, per_channel,
                                     transposed):
    desc = _desc(src_t, wei_t, dst_t, ((), 70, 96, 48), transposed=transposed, src_zp=src_zp, wei_zps=wei_zps,
                 per_channel=per_channel, post_ops=(("eltwise", "relu", 0.0, 0.0),))
    arrays = _inputs(rng, desc)
    tile = quantized_matmul_mma.choose_tile(70, 48, 1, tensor_cores.kernel_config).name
    spec = quantized_matmul.generate(desc, tensor_cores.kernel_config, mma_tile=tile)
    out_type = {"f32": np.float32, "s8": np.int8, "u8": np.uint8}[dst_t]
    got = run_spec(tensor_cores, spec, _stored(desc, arrays), desc.dst.dims, out_type)
    np.testing.assert_array_equal(got, quantized_matmul.reference(desc, arrays))

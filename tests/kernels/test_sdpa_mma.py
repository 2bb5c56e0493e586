"""The tensor-core attention (kernels/sdpa_mma.py): which attentions it takes, and its results
on an NVIDIA GPU of sm_80+ (test_tensor_core_emulation.py runs it elsewhere, its PTX emulated).

Operands are multiples of 1/8, exact in bf16 and f16, so the scores are exact; the
probabilities are rounded to the operand type for P V, which moves dst by at most that type's
unit roundoff times max |v| (1 here): the tolerance allows twice that.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from _gpu_matmul import run_spec

from triodnn import MemoryDesc, SdpaDesc
from triodnn._values._dtypes import to_storage
from triodnn.kernels import sdpa, sdpa_mma, select_config

SM90 = select_config("gpu", 1024, 48 * 1024, nvidia_sm=90)


def md(*dims, dtype="bf16", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


@pytest.fixture
def tensor_cores(engine):
    if engine.info.nvidia_sm < 80:
        pytest.skip(f"the tensor-core kernels need an NVIDIA device of sm_80+; this is {engine}")
    return engine


def test_it_takes_plain_16_bit_attention_on_sm80():
    plain = SdpaDesc(md(2, 8, 128, 64), md(2, 8, 128, 64), md(2, 8, 128, 64), scale=md(1, dtype="f32"))
    assert sdpa_mma.applies(plain, SM90)
    assert sdpa_mma.applies(attrs.evolve(plain, causal="bottom_right", mask=md(1, 1, 128, 128, dtype="f32")), SM90)
    gqa = SdpaDesc(md(1, 2, 4, 64, 128), md(1, 2, 1, 64, 128), md(1, 2, 1, 64, 128))
    assert sdpa_mma.applies(gqa, SM90)
    refused = {
        "f32": SdpaDesc(md(1, 64, 64, dtype="f32"), md(1, 64, 64, dtype="f32"), md(1, 64, 64, dtype="f32")),
        "mixed types": SdpaDesc(md(1, 64, 64), md(1, 64, 64, dtype="f16"), md(1, 64, 64)),
        "head size 72": SdpaDesc(md(1, 64, 72), md(1, 64, 72), md(1, 64, 72)),
        "head size 256": SdpaDesc(md(1, 64, 256), md(1, 64, 256), md(1, 64, 256)),
        "K transposed": SdpaDesc(md(1, 64, 64), md(1, 64, 64, strides=(4096, 1, 64)), md(1, 64, 64)),
        "softcap": attrs.evolve(plain, softcap=md(1, dtype="f32")),
    }
    assert {why for why, desc in refused.items() if sdpa_mma.applies(desc, SM90)} == set()
    assert not sdpa_mma.applies(plain, attrs.evolve(SM90, nvidia_sm=75))
    assert sdpa.generate(plain, SM90, tensor_cores=True).impl == "ocl:sdpa:mma:q64:k64:l128"
    # Chosen by itself only once measured on a GPU (sdpa_mma.CHOSEN).
    assert sdpa.generate(plain, SM90).impl.startswith("ocl:sdpa:mma:") is sdpa_mma.CHOSEN


def grid(rng, *shape) -> np.ndarray:
    return (rng.integers(-8, 9, shape) / 8).astype(np.float32)


@pytest.mark.parametrize("dtype, batch, kv_batch, sq, skv, d, causal, masked", [
    ("bf16", (2, 4), (2, 4), 200, 200, 64, None, False),
    ("f16", (1, 2), (1, 2), 64, 300, 128, "bottom_right", True),
    ("bf16", (1, 2, 4), (1, 2, 1), 130, 130, 128, "top_left", False),  # GQA: K and V heads broadcast
    ("bf16", (3,), (3,), 1, 77, 64, None, True),                        # one query row (decoding)
])
async def test_results(tensor_cores, rng, dtype, batch, kv_batch, sq, skv, d, causal, masked):
    q, k, v = grid(rng, *batch, sq, d), grid(rng, *kv_batch, skv, d), grid(rng, *kv_batch, skv, d)
    mask = (rng.integers(-4, 1, (sq, skv)) / 4).astype(np.float32) if masked else None
    scale = np.array([0.125], np.float32)
    desc = SdpaDesc(md(*batch, sq, d, dtype=dtype), md(*kv_batch, skv, d, dtype=dtype),
                    md(*kv_batch, skv, d, dtype=dtype), md(*batch, sq, d, dtype="f32"), scale=md(1, dtype="f32"),
                    mask=md(sq, skv, dtype="f32") if masked else None, causal=causal)
    spec = sdpa.generate(desc, tensor_cores.kernel_config, tensor_cores=True)
    assert spec.impl.startswith("ocl:sdpa:mma:")
    arrays = {"query": to_storage(q, dtype), "key": to_storage(k, dtype), "value": to_storage(v, dtype),
              "scale": scale, **({"mask": mask} if masked else {})}
    got = run_spec(tensor_cores, spec, arrays, desc.dst.dims)
    want = sdpa.reference(q, k, v, mask=mask, scale=scale, causal=causal)
    np.testing.assert_allclose(got, want, atol={"bf16": 2.0 ** -8, "f16": 2.0 ** -11}[dtype] + 1e-5, rtol=0)

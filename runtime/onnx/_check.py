"""A model checked against outputs no one here computed, and timed: what ``triodnn onnx`` runs.

ONNX's model directories (the model zoo's, the ``onnx`` wheel's test data) keep
``test_data_set_N/input_K.pb`` and ``output_K.pb`` beside ``model.onnx``: each data set runs and
its outputs are compared with the shipped ones at ONNX's model-test tolerance (rtol 1e-3, atol
1e-7). A model without data sets runs on inputs drawn here (normal, seed 0; a symbolic dim is 1)
against ONNX Runtime where it is installed (what a user would run the model on instead; its CPU
provider), else against ONNX's reference evaluator. Symbolic dims take the first data set's sizes. ``mode`` P
times ``repeat`` runs of the first data set, each awaited (wall time of one request, as a
pipeline's caller sees it).
"""

from __future__ import annotations

import importlib
import os
import re
import time
from collections.abc import Mapping
from types import ModuleType

import attrs
import numpy as np
import onnx
import onnx.numpy_helper

from .._runtime import open_runtime, parse_engine_spec
from ..graph import compile_graph
from ._builder import OnnxImportError, reference_evaluator
from ._import import declared_dims, from_onnx, load_model, model_inputs

_onnxruntime: ModuleType | None
try:
    _onnxruntime = importlib.import_module("onnxruntime")
except ImportError:  # optional: ONNX's reference evaluator stands in for it
    _onnxruntime = None

RTOL, ATOL = 1e-3, 1e-7


@attrs.frozen
class DataSetCheck:
    """One data set's outcome: whether every output is within tolerance, and the largest
    absolute difference from the expected outputs."""

    name: str
    passed: bool
    max_abs_error: float
    detail: str = ""


@attrs.frozen
class ModelCheck:
    """``check_model``'s result: the engine, each data set's check (mode C), and the wall
    times in ms of the timed runs (mode P)."""

    model: str
    engine: str
    data_sets: tuple[DataSetCheck, ...]
    times_ms: tuple[float, ...]
    wildcard_ops: int

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.data_sets)


def reference_name() -> str:
    """What computes the expected outputs of a model without data sets."""
    return f"ONNX Runtime {_onnxruntime.__version__}" if _onnxruntime is not None else "onnx.reference"


def reference_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *,
                      onnxruntime: bool = True) -> list[np.ndarray]:
    """The model's outputs for ``feeds`` by ``reference_name()``: ONNX Runtime's CPU provider
    where installed (and ``onnxruntime``), else ONNX's reference evaluator."""
    if onnxruntime and _onnxruntime is not None:
        session = _onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return [np.asarray(r) for r in session.run(None, feeds)]
    return [np.asarray(r) for r in reference_evaluator(model).run(None, feeds)]


def data_sets(model_path: str, model: onnx.ModelProto) -> list[tuple[str, list[np.ndarray], list[np.ndarray] | None]]:
    """``(name, inputs, expected outputs)`` of each ``test_data_set_*`` beside ``model_path``;
    without any, one drawn set whose outputs ``reference_outputs`` gives."""
    folder = os.path.dirname(os.path.abspath(model_path))
    found = sorted((d for d in os.listdir(folder) if re.fullmatch(r"test_data_set_\d+", d)),
                   key=lambda d: int(d.rsplit("_", 1)[1]))
    if found:
        return [(name, _tensors(os.path.join(folder, name), "input"), _tensors(os.path.join(folder, name), "output"))
                for name in found]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([d if d > 0 else 1 for d in declared_dims(info)]).astype(
        onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)) for info in model_inputs(model)]
    return [(f"drawn (seed 0) against {reference_name()}", inputs, None)]


def _tensors(folder: str, prefix: str) -> list[np.ndarray]:
    names = sorted((f for f in os.listdir(folder) if re.fullmatch(rf"{prefix}_\d+\.pb", f)),
                   key=lambda f: int(f[len(prefix) + 1:-3]))
    return [onnx.numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, f))) for f in names]


def compare(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[bool, float, str]:
    """Whether every output is within ONNX's model-test tolerance, the largest difference, and
    what went wrong where one is not."""
    if len(got) != len(want):
        return False, float("inf"), f"{len(got)} outputs, {len(want)} expected"
    worst, detail = 0.0, ""
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return False, float("inf"), f"output {i} has shape {g.shape}, expected {w.shape}"
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
        worst = max(worst, float(diff.max(initial=0.0)))
        bad = diff > ATOL + RTOL * np.abs(w.astype(np.float64))
        if bad.any() and not detail:
            first = tuple(int(x) for x in np.argwhere(bad)[0])
            detail = f"output {i}: {int(bad.sum())} of {bad.size} outside tolerance; at {first} {g[first]} vs {w[first]}"
    return not detail, worst, detail


def batched(sets: list, batch: int) -> list:
    """Each data set's inputs and expected outputs of batch 1 repeated ``batch`` times along the
    first dim (a batch of the same sample, whose outputs are the sample's repeated)."""
    def repeat(arrays):
        return None if arrays is None else [np.repeat(a, batch, axis=0) if a.ndim and a.shape[0] == 1 else a
                                            for a in arrays]
    return [(f"{name} x{batch}", repeat(inputs), repeat(expected)) for name, inputs, expected in sets]


async def check_model(model_path: str, *, engine_spec: str | None = None, mode: str = "C", repeat: int = 20,
                      input_shapes: Mapping[str, tuple] | None = None, batch: int | None = None) -> ModelCheck:
    """Check (``mode`` containing C) and time (P) the model at ``model_path`` on the engine
    ``engine_spec`` names (default: the default engine). ``batch`` runs each data set's sample
    that many times in one request (inputs of batch 1 repeated along the first dim)."""
    if mode not in ("C", "P", "CP"):
        raise OnnxImportError(f"mode {mode!r} is not C, P or CP")
    if repeat < 1:
        raise OnnxImportError(f"repeat {repeat} must be at least 1")
    if batch is not None and batch < 1:
        raise OnnxImportError(f"batch {batch} must be at least 1")
    model = load_model(model_path)
    sets = data_sets(model_path, model)
    if batch is not None and batch > 1:
        sets = batched(sets, batch)
    # Symbolic dims take the first data set's sizes: a static graph compiles once, and nodes
    # left to handlers need their output shapes.
    names = [info.name for info in model_inputs(model)]
    shapes = {name: tuple(a.shape) for name, a in zip(names, sets[0][1])} | dict(input_shapes or {})
    onnx_graph = from_onnx(model, input_shapes=shapes)
    async with open_runtime() as rt:
        engine = await (rt.engine(*parse_engine_spec(engine_spec)) if engine_spec else rt.engine())
        runner = await compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants,
                                     handlers=onnx_graph.handlers())
        stream = await engine.stream()

        async def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
            return onnx_graph.ordered_outputs(await runner.run(stream, onnx_graph.feeds(dict(zip(names, inputs)))))

        checks = []
        if "C" in mode:
            for name, inputs, expected in sets:
                if len(inputs) != len(names):
                    checks.append(DataSetCheck(name, False, float("inf"),
                                               f"{len(inputs)} inputs in the data set; the model takes {len(names)}"))
                    continue
                if expected is None:
                    expected = reference_outputs(model, dict(zip(names, inputs)))
                passed, worst, detail = compare(await run(inputs), expected)
                checks.append(DataSetCheck(name, passed, worst, detail))
        times = []
        if "P" in mode:
            inputs = sets[0][1]
            await run(inputs)  # the first run uploads the constants
            for _ in range(repeat):
                started = time.perf_counter()
                await run(inputs)
                times.append((time.perf_counter() - started) * 1e3)
        label = f"{engine.kind}:{engine.index} ({engine.info.name})"
    return ModelCheck(model_path, label, tuple(checks), tuple(times), len(onnx_graph.wildcard_nodes))

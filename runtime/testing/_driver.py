"""``triodnn graph``: run a serialized oneDNN graph, check it against numpy, or time it.

Correctness mode (``C``) does what benchdnn's graph driver does: fill the graph inputs with data
chosen so f32 results are exact where they can be (small integers into matmul and convolution,
positive divisors, boolean masks), run every partition on the engine, compute the graph op by op
in numpy, and compare each graph output within the tolerance of the ops that made it. Partitions
run in their topological order, each fed by the outputs of the earlier ones. Performance mode
(``P``) runs the compiled partitions repeatedly and prints the time per run.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import attrs
import numpy as np

from .. import _trace
from .._runtime import open_runtime
from .._stream import StreamFlags
from .._values._dtypes import from_storage, to_storage  # _attention_stats: row statistics in their dtype
from .._values._errors import InvalidArgumentError, InvalidGraphError, TriodnnError, UnsupportedError
from ..graph import Graph, LogicalTensor, Tensor, from_dict
from ..graph._logical_tensor import GRAPH_DTYPES, PROPERTY_TYPES, known_shape
from ..graph._op_schema import OP_SCHEMAS, schema_of
from ..graph._progress import progress_callback
from ..graph._shape_inference import infer_output_shapes
from . import _benchdnn
from ._filling import batch_statistics, fill_input, tolerance
from ._reference import magnitudes as reference_magnitudes
from ._reference import reference

_UNKNOWN = -(2**63)


@attrs.frozen
class OutputCheck:
    id: int
    max_abs_error: float
    max_rel_error: float
    mismatches: int
    total: int
    rtol: float
    atol: float

    @property
    def passed(self) -> bool:
        return self.mismatches == 0


@attrs.frozen
class CaseResult:
    case: str
    # PASSED, FAILED, UNIMPLEMENTED, PERF (run_case's --mode P); the harness driver adds
    # SKIPPED and INVALID_ARGUMENTS, benchdnn's other states.
    status: str
    partitions: tuple[str, ...]
    checks: tuple[OutputCheck, ...] = ()
    message: str = ""
    ms_per_run: float | None = None   # average over the timed runs
    runs: int = 0
    seconds: float = 0.0
    repro: str = ""                   # benchdnn's options of the run (harness driver)
    min_ms: float | None = None
    gflops: float | None = None       # per run, where the partitions' flops are defined

    def summary(self) -> str:
        parts = f"{len(self.partitions)} partition(s): " + "; ".join(self.partitions)
        line = f"{self.status} {self.case}: {parts}"
        if self.ms_per_run is not None:
            line += f"; {self.ms_per_run:.3f} ms per run ({self.runs} runs)"
        if self.message:
            line += f"\n    {self.message}"
        for check in self.checks:
            if not check.passed:
                line += (f"\n    output {check.id}: {check.mismatches}/{check.total} elements off; "
                         f"max abs {check.max_abs_error:.3g}, max rel {check.max_rel_error:.3g} "
                         f"(rtol {check.rtol:g}, atol {check.atol:g})")
        return line


def parse_in_shapes(text: str | None) -> dict[int, tuple[int, ...]]:
    """``ID:SHAPE+ID:SHAPE`` with SHAPE as ``AxBxC`` (benchdnn's --in-shapes); ``ID:-`` is 0-D."""
    shapes: dict[int, tuple[int, ...]] = {}
    if not text:
        return shapes
    for item in text.split("+"):
        try:
            lt_id, shape = item.split(":", 1)
            dims = () if shape in ("", "-") else tuple(int(d) for d in shape.split("x"))
            shapes[int(lt_id)] = dims
        except ValueError:
            raise InvalidArgumentError(f"--in-shapes entry {item!r} is not ID:AxBxC") from None
        if any(d < 0 for d in dims):  # 0 is an empty tensor, as in benchdnn
            raise InvalidArgumentError(f"--in-shapes entry {item!r} has a negative dim")
    return shapes


def parse_dt(text: str | None) -> tuple[str | None, dict[int, str]]:
    """``f32`` (every floating tensor) or ``ID:dt+ID:dt`` (those tensors)."""
    if not text:
        return None, {}
    if ":" not in text:
        return text, {}
    out = {}
    for item in text.split("+"):
        try:
            lt_id, dt = item.split(":", 1)
            out[int(lt_id)] = dt
        except ValueError:
            raise InvalidArgumentError(f"--dt entry {item!r} is not ID:dt") from None
    return None, out


_FLOATING = ("f32", "bf16", "f16")


def rewrite(document: dict, in_shapes: dict[int, tuple[int, ...]], dt_all: str | None,
            dt_by_id: dict[int, str]) -> dict:
    """The document with new input shapes (every produced tensor's shape then re-inferred) and
    data types."""
    document = json.loads(json.dumps(document))
    produced = {t["id"] for op in document.get("graph", []) for t in op.get("outputs", [])}
    known = {t["id"] for op in document.get("graph", []) for t in op.get("inputs", []) + op.get("outputs", [])}
    unknown_ids = sorted(set(in_shapes) - known)
    if unknown_ids:
        raise InvalidArgumentError(f"--in-shapes names logical tensor ids {unknown_ids} not in the graph")
    for op in document.get("graph", []):
        for t in op.get("inputs", []) + op.get("outputs", []):
            if in_shapes:
                if t["id"] in in_shapes:
                    t["shape"] = list(in_shapes[t["id"]])
                    t["stride"] = [_UNKNOWN] * len(in_shapes[t["id"]])
                elif t["id"] in produced:
                    t["shape"] = [_UNKNOWN] * len(t.get("shape", []))
                    t["stride"] = [_UNKNOWN] * len(t.get("shape", []))
            if dt_all and t.get("dtype") in _FLOATING:
                t["dtype"] = dt_all
            if t["id"] in dt_by_id:
                t["dtype"] = dt_by_id[t["id"]]
    return document


def _graph_inputs(graph: Graph) -> list[LogicalTensor]:
    return graph.input_tensors()


def _consumer_kinds(graph: Graph, lt_id: int) -> set[str]:
    return {op.kind for op in graph.consumers(lt_id)}


_NORM_TRAINING_KINDS = frozenset({"BatchNormForwardTraining", "BatchNormTrainingBackward", "LayerNormBackward"})


def _role(graph: Graph, lt: LogicalTensor) -> str | None:
    """What a graph input is to its consumer, where filling needs to know (divisor, mask…)."""
    for op in graph.consumers(lt.id):
        index = [t.id for t in op.inputs].index(lt.id)
        if op.kind == "Divide" and index == 1:
            return "divisor"
        if op.kind == "Multiply" and lt.numel == 1:
            return "scale"  # attention's 1/sqrt(d): a power of two keeps the scores exact
        if op.kind == "BatchNormInference" and index == 4:
            return "variance"
        if op.kind in _NORM_TRAINING_KINDS:  # normalization training: statistics and parameters by their input name
            name = schema_of(op.kind).input_names[index]
            if name in ("mean", "variance", "gamma", "beta"):
                return name
        if op.kind == "Dropout" and index == 3:  # Dropout's p
            return "probability"
        if op.kind in ("Add",) and op.inputs[0].shape and lt.shape is not None and any(
                c.kind in ("SoftMax", "LogSoftmax") for t in op.outputs for c in graph.consumers(t.id)):
            return "mask"
    return None


def _inferred_shapes(graph: Graph) -> dict[int, tuple[int, ...]]:
    """Every tensor's shape, inferred from the graph inputs' (a rewrite may have made the
    produced ones unknown); tensors whose shape cannot be inferred are left out."""
    shapes = {lt.id: known_shape(lt) for lt in _graph_inputs(graph) if lt.is_shape_known}
    for op in graph.ops:
        found = [shapes.get(lt.id) for lt in op.inputs]
        ins = [s for s in found if s is not None]
        if op.kind == "End" or len(ins) < len(found):
            continue
        try:
            outs = infer_output_shapes(op.kind, op.attrs, ins, len(op.outputs))
        except TriodnnError:
            continue
        for lt, shape in zip(op.outputs, outs):
            shapes[lt.id] = tuple(shape)
    return shapes


def _sequence_offsets(graph: Graph) -> dict[int, int]:
    """The graph inputs of bottom-right causal masks (``GenIndex(rows) + Skv - Sq >= GenIndex(cols)``,
    an s32 Add, a Subtract, a GreaterEqual) and the value benchdnn's graph driver gives each
    (input_displacer.cpp): the Add's offset is Skv, the other operand's last dim, the
    Subtract's Sq, its dim -2. Random offsets would mask rows at random, so such inputs (host
    scalars in oneDNN's graphs) get these values."""
    shapes: dict[int, tuple[int, ...]] | None = None
    offsets = {}
    inputs = {lt.id for lt in _graph_inputs(graph)}
    for op in graph.ops:
        if op.kind != "Add" or op.outputs[0].dtype != "s32":
            continue
        subtract = graph.consumers(op.outputs[0].id)
        if len(subtract) != 1 or subtract[0].kind != "Subtract":
            continue
        compare = graph.consumers(subtract[0].outputs[0].id)
        if len(compare) != 1 or compare[0].kind != "GreaterEqual":
            continue
        if shapes is None:
            shapes = _inferred_shapes(graph)
        for step, axis in ((op, -1), (subtract[0], -2)):
            for i, lt in enumerate(step.inputs[:2]):
                other = shapes.get(step.inputs[1 - i].id)
                if lt.id in inputs and other is not None and len(other) >= 2:
                    offsets[lt.id] = other[axis]
    return offsets


def make_inputs(graph: Graph, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {}
    offsets = _sequence_offsets(graph)
    for lt in _graph_inputs(graph):
        if not lt.is_shape_known:
            raise InvalidGraphError(
                f"graph input {lt.id} has shape {lt.shape}; give it with --in-shapes {lt.id}:AxB"
            )
        if lt.id in offsets:
            arrays[lt.id] = np.full(known_shape(lt), offsets[lt.id], dtype=np.int32)
            continue
        arrays[lt.id] = fill_input(lt.dtype, known_shape(lt), _consumer_kinds(graph, lt.id), rng,
                                   role=_role(graph, lt))
    # The backward normalizations get src's own statistics (see batch_statistics).
    for op in graph.ops:
        stats = op.inputs[2:4]
        if op.kind in _NORM_TRAINING_KINDS - {"BatchNormForwardTraining"} and all(
                lt.id in arrays for lt in (op.inputs[0], *stats)):
            values = batch_statistics(op.kind, op.attrs, arrays[op.inputs[0].id], (stats[0].dtype, stats[1].dtype))
            for lt, value in zip(stats, values):
                arrays[lt.id] = value.reshape(known_shape(lt))
    _attention_stats(graph, arrays)  # attention backward's softmax row statistics
    return arrays


# Attention backward (with or without Dropout) takes the forward softmax's row statistics as a graph
# input (subtracted from the scores before Exp). Random ones overflow exp to inf and near
# f32's top, where the partition's f32 sums and the float64 reference overflow differently
# (dropout's 1 / (1 - p) makes it likelier). The scores' row maxima, what a forward pass gives,
# keep exp <= 1.
def _attention_stats(graph: Graph, arrays: dict[int, np.ndarray]) -> None:
    inputs = {lt.id for lt in _graph_inputs(graph)}
    targets = []
    for op in graph.ops:
        if op.kind != "Subtract" or op.inputs[1].id not in inputs or op.inputs[0].id in inputs:
            continue
        if any(c.kind == "Exp" for c in graph.consumers(op.outputs[0].id)):
            targets.append((op.inputs[0].id, op.inputs[1]))
    if not targets:
        return
    values = dict(arrays)
    for op in graph.ops:
        if all(scores in values for scores, _ in targets):
            break
        if op.kind == "End" or any(lt.id not in values for lt in op.inputs):
            continue
        results = reference(op.kind, op.attrs, [values[lt.id] for lt in op.inputs], [lt.dtype for lt in op.outputs])
        values.update((lt.id, value) for lt, value in zip(op.outputs, results))
    for scores, stats in targets:
        if scores not in values or stats.dtype not in ("f32", "f16", "bf16"):
            continue
        row_max = np.max(np.asarray(values[scores], np.float64), axis=-1, keepdims=True)
        if row_max.shape != known_shape(stats):
            continue
        row_max = np.where(np.isfinite(row_max), row_max, 0.0).astype(np.float32)
        arrays[stats.id] = from_storage(to_storage(row_max, stats.dtype), stats.dtype).reshape(row_max.shape)


def reference_outputs(graph: Graph, arrays: dict[int, np.ndarray]):
    """Every tensor's reference value, and for outputs that are sums (MatMul, Convolution,
    ReduceSum, LayerNormBackward's gamma and beta gradients: ``GraphOp.magnitude``) the size of
    their sums: a sum's rounding error is relative to the sizes of its terms, not to its result,
    which cancellation can make small."""
    values = dict(arrays)
    magnitudes = {}
    for op in graph.ops:
        if op.kind == "End":
            continue
        inputs = [values[lt.id] for lt in op.inputs]
        dtypes = [lt.dtype for lt in op.outputs]
        results = reference(op.kind, op.attrs, inputs, dtypes)
        for lt, value in zip(op.outputs, results):
            values[lt.id] = value
        for lt, size in zip(op.outputs, reference_magnitudes(op.kind, op.attrs, inputs, len(op.outputs))):
            if size is not None:
                magnitudes[lt.id] = size
    return values, magnitudes


def _kinds_upstream(graph: Graph, lt_id: int) -> set[str]:
    kinds, stack, seen = set(), [lt_id], set()
    while stack:
        t = stack.pop()
        op = graph.producer(t)
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        kinds.add(op.kind)
        stack.extend(x.id for x in op.inputs)
    return kinds


def compare(lt: LogicalTensor, got: np.ndarray, want: np.ndarray, kinds: set[str],
            magnitude: np.ndarray | None = None) -> OutputCheck:
    """Elements pass when ``|got - want| <= atol + rtol * max(|want|, magnitude)``."""
    rtol, atol = tolerance(kinds, lt.dtype)
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    w = np.asarray(want, dtype=np.float64).reshape(-1)
    scale = np.abs(w) if magnitude is None else np.maximum(np.abs(w), np.abs(np.asarray(magnitude, dtype=np.float64)).reshape(-1))
    if g.shape != w.shape:
        return OutputCheck(lt.id, math.inf, math.inf, max(g.size, w.size), max(g.size, w.size), rtol, atol)
    both_nan = np.isnan(g) & np.isnan(w)
    same_inf = np.isinf(g) & (g == w)
    with np.errstate(invalid="ignore"):  # inf - inf: judged by same_inf
        diff = np.abs(g - w)
    bad = ~(both_nan | same_inf) & ~(diff <= atol + rtol * scale)
    finite = np.isfinite(diff)
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    rel = diff / np.maximum(np.abs(w), np.finfo(np.float32).tiny)
    max_rel = float(rel[finite].max()) if finite.any() else 0.0
    return OutputCheck(lt.id, max_abs, max_rel, int(bad.sum()), int(g.size), rtol, atol)


async def run_graph(graph: Graph, engine, stream, arrays: dict[int, np.ndarray], policy: str,
                    *, repeat: int = 0, timings: list[float] | None = None, progress=None):
    """Execute every partition; returns (partitions, {tensor id: result array}, ms per run).
    With ``timings``, each timed run is awaited alone and its milliseconds appended (benchdnn's
    min and average need them one by one). ``progress`` (``compile_graph``'s) hears of each
    partition compiled."""
    report = progress_callback(progress, "compiling")
    partitions = graph.get_partitions(policy)
    unsupported = [p for p in partitions if not p.is_supported]
    if unsupported:
        return partitions, None, None
    known: dict[int, LogicalTensor] = {lt.id: lt for lt in _graph_inputs(graph)}
    tensors: dict[int, Tensor] = {}
    for lt in _graph_inputs(graph):
        tensors[lt.id] = await Tensor.from_numpy(known[lt.id].evolve(layout_type="strided", strides=None)
                                                 if known[lt.id].layout_type != "strided" else known[lt.id],
                                                 engine, arrays[lt.id])
    compiled: list[tuple] = []
    for partition in partitions:
        ins = [tensors[lt.id].logical_tensor for lt in partition.input_ports]
        with _trace.span(f"compile partition {partition.id}", engine=engine,
                         track="compile partitions", ops="+".join(partition.op_kinds)):
            cp = await partition.compile(engine, ins, None)
        if report is not None:
            report(len(compiled) + 1, len(partitions), f"partition {partition.id}: {'+'.join(partition.op_kinds)}")
        outs = [Tensor(lt, engine) for lt in cp.outputs]
        for t in outs:
            tensors[t.logical_tensor.id] = t
        compiled.append((cp, [tensors[lt.id] for lt in partition.input_ports], outs))
    event = None
    for cp, in_tensors, out_tensors in compiled:
        event = cp.execute(stream, in_tensors, out_tensors)
    if event is not None:  # None: no partition to run
        await event
    ms = None
    if repeat and timings is not None:
        for _ in range(repeat):
            start = time.perf_counter()
            for cp, in_tensors, out_tensors in compiled:
                event = cp.execute(stream, in_tensors, out_tensors)
            if event is not None:
                await event
            timings.append((time.perf_counter() - start) * 1e3)
        ms = sum(timings) / len(timings)
    elif repeat:
        start = time.perf_counter()
        for _ in range(repeat):
            for cp, in_tensors, out_tensors in compiled:
                event = cp.execute(stream, in_tensors, out_tensors)
        if event is not None:
            await event
        ms = (time.perf_counter() - start) * 1e3 / repeat
    results = {}
    for lt in graph.output_tensors():
        results[lt.id] = await tensors[lt.id].to_numpy()
    return partitions, results, ms


def describe(partitions) -> tuple[str, ...]:
    return tuple(("" if p.is_supported else "unsupported ") + "+".join(p.op_kinds) for p in partitions)


async def run_case(path, *, engine, mode: str = "C", policy: str = "fusion",
                   in_shapes: str | None = None, dt: str | None = None,
                   expected_n_partitions: int | None = None, repeat: int = 20,
                   seed: int = 0) -> CaseResult:
    case = Path(path).name
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidGraphError(f"cannot read graph {str(path)!r}: {exc}") from None
    dt_all, dt_by_id = parse_dt(dt)
    document = rewrite(document, parse_in_shapes(in_shapes), dt_all, dt_by_id)
    graph = from_dict(document)
    stream = await engine.stream(StreamFlags.in_order)
    arrays = make_inputs(graph, seed)
    partitions, results, ms = await run_graph(graph, engine, stream, arrays, policy,
                                              repeat=repeat if mode == "P" else 0)
    names = describe(partitions)
    if expected_n_partitions is not None and len(partitions) != expected_n_partitions:
        return CaseResult(case, "FAILED", names,
                          message=f"expected {expected_n_partitions} partition(s), got {len(partitions)}")
    if results is None:
        return CaseResult(case, "UNIMPLEMENTED", names, message="the graph has unsupported partitions")
    if mode == "P":
        return CaseResult(case, "PERF", names, ms_per_run=ms, runs=repeat)
    want, magnitudes = reference_outputs(graph, arrays)
    checks = tuple(compare(graph.tensor(i), got, want[i], _kinds_upstream(graph, i), magnitudes.get(i))
                   for i, got in results.items())
    status = "PASSED" if all(c.passed for c in checks) else "FAILED"
    return CaseResult(case, status, names, checks)


class Progress:
    """A one-line progress bar on stderr while a case runs (only on a terminal: logs stay clean),
    with the stage of the case (its partitions compiled: a cold compile takes seconds)."""

    def __init__(self, total: int, stream=None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()

    def show(self, index: int, name: str, stage: str = "") -> None:
        if self.live:
            done = int(20 * (index - 1) / self.total)
            line = f"[{'#' * done}{'.' * (20 - done)}] {index}/{self.total} {name[-40:]} {stage}"
            self.stream.write("\r" + line[:79].ljust(79))
            self.stream.flush()

    def stage(self, index: int, name: str):
        """The ``(done, total, what)`` callback that shows case ``index``'s compile progress."""
        return lambda done, total, what: self.show(index, name, f"compiling {done}/{total}")

    def clear(self) -> None:
        if self.live:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()


def engine_line(engine) -> str:
    """Which engine runs the cases: its label, device and OpenCL platform (which CPU runtime)."""
    info = engine.info
    return f"engine {engine.kind}:{engine.index}: {info.name} ({info.platform}, {info.platform_version})"


def _engine_args(spec: str) -> tuple:
    kind, _, index = spec.partition(":")
    return (kind, int(index or 0))


# --- benchdnn harness runs -----------------------------------------------------------------

# benchdnn's states, in the order its summary line names them.
STATES = ("PASSED", "SKIPPED", "MISTRUSTED", "UNIMPLEMENTED", "INVALID_ARGUMENTS", "FAILED")
# Data types oneDNN names that no OpenCL device here computes in: benchdnn skips what the
# device lacks. The others triodnn lacks (f8, s4, …) are triodnn's gaps: UNIMPLEMENTED.
_DEVICE_LACKS = ("f64",)


def _not_runnable(document: dict) -> tuple[str, str] | None:
    """A graph triodnn cannot load for a reason that is its own or the device's, not the
    graph's: (state, every such reason), before ``from_dict`` calls it malformed."""
    ops = document.get("graph") if isinstance(document, dict) else None
    if not isinstance(ops, list):
        return None
    ops = [op for op in ops if isinstance(op, dict)]
    tensors = [t for op in ops for t in op.get("inputs", []) + op.get("outputs", []) if isinstance(t, dict)]
    lacking = sorted({t["dtype"] for t in tensors if t.get("dtype") in _DEVICE_LACKS})
    if lacking:
        return "SKIPPED", f"data type {', '.join(lacking)} is not supported by the device"
    kinds = sorted({str(op.get("kind")) for op in ops})
    dtypes = sorted({str(t.get("dtype")) for t in tensors})
    properties = sorted({str(t.get("property_type")) for t in tensors})
    reasons = [f"op kind {kind} is not implemented" for kind in kinds
               if kind in _benchdnn.ONEDNN_OP_KINDS and kind not in OP_SCHEMAS]
    reasons += [f"data type {dt} is not implemented" for dt in dtypes
                if dt in _benchdnn.ONEDNN_DTYPES and dt not in GRAPH_DTYPES]
    reasons += [f"property_type {prop} is not implemented" for prop in properties
                if prop in _benchdnn.PROPERTIES and prop not in PROPERTY_TYPES]
    return ("UNIMPLEMENTED", "; ".join(reasons)) if reasons else None


def _flops(graph: Graph, arrays: dict[int, np.ndarray]) -> float | None:
    """Multiply-adds ×2 of the graph's MatMul and Convolution ops (SDPA is two MatMuls), with
    shapes inferred from the inputs; None when the graph has neither."""
    shapes: dict[int, tuple[int, ...]] = {lt_id: a.shape for lt_id, a in arrays.items()}
    total = 0.0
    counted = False
    for op in graph.ops:
        if op.kind == "End":
            continue
        found = [shapes.get(lt.id) for lt in op.inputs]
        ins = [s for s in found if s is not None]
        if len(ins) < len(found):
            return None
        try:
            outs = infer_output_shapes(op.kind, op.attrs, ins, len(op.outputs))
        except TriodnnError:
            return None
        for lt, shape in zip(op.outputs, outs):
            shapes[lt.id] = tuple(shape)
        if op.kind == "MatMul":
            a = ins[0]
            k = a[-2] if op.attrs.get("transpose_a") and len(a) > 1 else a[-1]
            total += 2.0 * math.prod(outs[0]) * k
            counted = True
        elif op.kind == "Convolution":
            w = ins[1]
            fmt = op.attrs.get("weights_format", "XIO")
            ic_per_group = w[-2] if fmt == "XIO" else w[1]
            spatial = w[:-2] if fmt == "XIO" else w[2:]
            total += 2.0 * math.prod(outs[0]) * ic_per_group * math.prod(spatial)
            counted = True
    return total if counted else None


async def run_benchdnn(run: _benchdnn.Run, *, engine, policy: str = "fusion", repeat: int = 20,
                       seed: int = 0, progress=None) -> CaseResult:
    """One harness run in benchdnn's terms: the graph rewritten by the run's options, checked
    (mode C), timed (P) or both (CP). Never raises for a graph or a triodnn gap: the state and
    its reason are in the result."""
    def result(status, names=(), message="", **kw):
        return CaseResult(run.case, status, tuple(names), message=message, repro=run.repro(), **kw)

    try:
        document = json.loads(run.path.read_text())
    except (OSError, ValueError) as exc:
        return result("INVALID_ARGUMENTS", message=f"cannot read graph {str(run.path)!r}: {exc}")
    try:
        document = _benchdnn.rewrite(document, run)
    except InvalidArgumentError as exc:
        return result("INVALID_ARGUMENTS", message=str(exc))
    except (KeyError, TypeError, AttributeError) as exc:  # a malformed document: from_dict says where
        return result("INVALID_ARGUMENTS", message=f"malformed graph: {_malformed(document, exc)}")
    verdict = _not_runnable(document)
    if verdict:
        return result(verdict[0], message=verdict[1])
    names: tuple[str, ...] = ()
    try:
        graph = from_dict(document)
        stream = await engine.stream(StreamFlags.in_order)
        arrays = make_inputs(graph, seed)
        timings: list[float] = []
        timed = "P" in run.mode
        partitions, results, _ = await run_graph(graph, engine, stream, arrays, policy, progress=progress,
                                                 repeat=repeat if timed else 0, timings=timings)
        names = describe(partitions)
        if results is None:
            # Before the count: an op triodnn lacks splits oneDNN's one partition into several.
            unsupported = sorted({n.removeprefix("unsupported ") for n in names if n.startswith("unsupported ")})
            return result("UNIMPLEMENTED", names, "unsupported partition(s): " + ", ".join(unsupported))
        expected = int(run.expected_n_partitions)
        # The count is oneDNN's fusion; op by op (policy debug) it means nothing.
        if policy == "fusion" and expected and len(partitions) != expected:
            return result("FAILED", names, f"expected {expected} partition(s), got {len(partitions)}: "
                                           + "; ".join(names))
        checks: tuple[OutputCheck, ...] = ()
        if "C" in run.mode:
            try:
                want, magnitudes = reference_outputs(graph, arrays)
            except TriodnnError as exc:
                # The partitions ran; the checker is what lacks the op: triodnn's gap, not the graph's.
                return result("UNIMPLEMENTED", names, f"numpy reference: {type(exc).__name__}: {exc}")
            checks = tuple(compare(graph.tensor(i), got, want[i], _kinds_upstream(graph, i), magnitudes.get(i))
                           for i, got in results.items())
        status = "PASSED" if all(c.passed for c in checks) else "FAILED"
        if timed and timings:
            flops = _flops(graph, arrays)
            return CaseResult(run.case, status, names, checks, repro=run.repro(),
                              ms_per_run=sum(timings) / len(timings), min_ms=min(timings), runs=len(timings),
                              gflops=None if flops is None else flops / (min(timings) * 1e6))
        return CaseResult(run.case, status, names, checks, repro=run.repro())
    except UnsupportedError as exc:
        return result("UNIMPLEMENTED", names, f"{type(exc).__name__}: {exc}")
    except InvalidArgumentError as exc:
        return result("INVALID_ARGUMENTS", names, f"{type(exc).__name__}: {exc}")
    except TriodnnError as exc:
        return result("FAILED", names, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a driver bug fails this run, not the suite
        return result("FAILED", names, f"internal error: {type(exc).__name__}: {exc}")


def _malformed(document, exc: Exception) -> str:
    """What ``from_dict`` says is wrong with a document the rewrite could not walk."""
    try:
        from_dict(document)
    except InvalidGraphError as detail:
        return f"{type(detail).__name__}: {detail}"
    return f"{type(exc).__name__}: {exc}"


def benchdnn_line(index: int, result: CaseResult) -> str:
    """benchdnn's line for a run: ``3:FAILED (reason) __REPRO: --mode=C ... --case=FILE``."""
    reason = result.message
    for check in result.checks:
        if not check.passed:
            reason = (f"output {check.id}: {check.mismatches}/{check.total} elements off, max abs "
                      f"{check.max_abs_error:.3g}, max rel {check.max_rel_error:.3g}")
            break
    reason = f" ({reason})" if reason and result.status != "PASSED" else ""
    return f"{index}:{result.status}{reason} __REPRO: {result.repro}"


def perf_line(engine_name: str, result: CaseResult) -> str:
    """benchdnn graph's perf line: engine, the run's options, min and average ms, GFLOP/s."""
    gflops = "" if result.gflops is None else f",{result.gflops:.4g}"
    return (f"perf,{engine_name},{result.repro},min(ms):{result.min_ms:.4g},"
            f"avg(ms):{result.ms_per_run:.4g}{gflops and ',GFLOPS:' + gflops[1:]}")


def summary_line(results: list[CaseResult]) -> str:
    """benchdnn's closing line: ``tests:N passed:N skipped:N … failed:N listed:N``."""
    counts = {state: 0 for state in (*STATES, "LISTED")}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    return f"tests:{len(results)} " + " ".join(f"{k.lower()}:{v}" for k, v in counts.items())


async def run_benchdnn_runs(runs: list[_benchdnn.Run], *, engine_spec: str | None, policy: str = "fusion",
                            repeat: int = 20, seed: int = 0) -> list[CaseResult]:
    """The engine's line, every harness run in order, one benchdnn line each, and the summary
    line."""
    async with open_runtime() as rt:
        engine = await (rt.engine(*_engine_args(engine_spec)) if engine_spec else rt.engine())
        print(engine_line(engine), flush=True)
        results = []
        progress = Progress(len(runs))
        for i, run in enumerate(runs):
            if run.mode == "L":  # benchdnn's list mode: the run's line, nothing read or run
                result = CaseResult(run.case, "LISTED", (), repro=run.repro())
                print(benchdnn_line(i, result), flush=True)
                results.append(result)
                continue
            progress.show(i + 1, run.case)
            started = time.perf_counter()
            with _trace.span(f"case {run.case}", track="graph driver"):
                result = await run_benchdnn(run, engine=engine, policy=policy, repeat=repeat, seed=seed,
                                            progress=progress.stage(i + 1, run.case) if progress.live else None)
            result = attrs.evolve(result, seconds=time.perf_counter() - started)
            progress.clear()
            print(benchdnn_line(i, result), flush=True)
            if result.min_ms is not None:
                print(perf_line(engine.kind, result), flush=True)
            results.append(result)
        print(summary_line(results), flush=True)
        return results

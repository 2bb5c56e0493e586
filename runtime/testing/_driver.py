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
from .._values._errors import InvalidArgumentError, InvalidGraphError, TriodnnError
from ..graph import Graph, LogicalTensor, Tensor, from_dict
from ..graph._logical_tensor import known_shape
from ._filling import fill_input, tolerance
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
    status: str                     # PASSED, FAILED, UNIMPLEMENTED, or PERF
    partitions: tuple[str, ...]
    checks: tuple[OutputCheck, ...] = ()
    message: str = ""
    ms_per_run: float | None = None
    runs: int = 0
    seconds: float = 0.0

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
        if any(d <= 0 for d in dims):
            raise InvalidArgumentError(f"--in-shapes entry {item!r} has a non-positive dim")
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
        if op.kind in ("Add",) and op.inputs[0].shape and lt.shape is not None and any(
                c.kind in ("SoftMax", "LogSoftmax") for t in op.outputs for c in graph.consumers(t.id)):
            return "mask"
    return None


def make_inputs(graph: Graph, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {}
    for lt in _graph_inputs(graph):
        if not lt.is_shape_known:
            raise InvalidGraphError(
                f"graph input {lt.id} has shape {lt.shape}; give it with --in-shapes {lt.id}:AxB"
            )
        arrays[lt.id] = fill_input(lt.dtype, known_shape(lt), _consumer_kinds(graph, lt.id), rng,
                                   role=_role(graph, lt))
    return arrays


_SUMMING = frozenset({"MatMul", "Convolution"})


def reference_outputs(graph: Graph, arrays: dict[int, np.ndarray]):
    """Every tensor's reference value, and for MatMul and Convolution outputs the magnitude of
    their sums (the same op on absolute values): a dot product's rounding error is relative to
    the sum of its terms' sizes, not to its result, which cancellation can make small."""
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
        if op.kind in _SUMMING:
            absolute = reference(op.kind, op.attrs, [np.abs(np.asarray(x, dtype=np.float32)) for x in inputs], ["f32"])
            magnitudes[op.outputs[0].id] = absolute[0]
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
    diff = np.abs(g - w)
    bad = ~(both_nan | same_inf) & ~(diff <= atol + rtol * scale)
    finite = np.isfinite(diff)
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    rel = diff / np.maximum(np.abs(w), np.finfo(np.float32).tiny)
    max_rel = float(rel[finite].max()) if finite.any() else 0.0
    return OutputCheck(lt.id, max_abs, max_rel, int(bad.sum()), int(g.size), rtol, atol)


async def run_graph(graph: Graph, engine, stream, arrays: dict[int, np.ndarray], policy: str,
                    *, repeat: int = 0):
    """Execute every partition; returns (partitions, {tensor id: result array}, ms per run)."""
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
    compiled = []
    for partition in partitions:
        ins = [tensors[lt.id].logical_tensor for lt in partition.input_ports]
        with _trace.span(f"compile partition {partition.id}", engine=engine,
                         track="compile partitions", ops="+".join(partition.op_kinds)):
            cp = await partition.compile(engine, ins, None)
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
    if repeat:
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


async def run_cases(paths, *, engine_spec: str | None, **options) -> list[CaseResult]:
    async with open_runtime() as rt:
        engine = await (rt.engine(*_engine_args(engine_spec)) if engine_spec else rt.engine())
        results = []
        progress = Progress(len(paths))
        for i, path in enumerate(paths, 1):
            progress.show(i, Path(path).name)
            started = time.perf_counter()
            try:
                with _trace.span(f"case {Path(path).name}", track="graph driver"):
                    result = await run_case(path, engine=engine, **options)
            except TriodnnError as exc:
                result = CaseResult(Path(path).name, "FAILED", (), message=f"{type(exc).__name__}: {exc}")
            result = attrs.evolve(result, seconds=time.perf_counter() - started)
            progress.clear()
            prefix = f"[{i}/{len(paths)}] " if len(paths) > 1 else ""
            print(prefix + result.summary(), flush=True)
            results.append(result)
        if len(results) > 1:
            print(summary_table(results), flush=True)
        return results


class Progress:
    """A one-line progress bar on stderr while a case runs (only on a terminal: logs stay clean)."""

    def __init__(self, total: int, stream=None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() and total > 1

    def show(self, index: int, name: str) -> None:
        if self.live:
            done = int(20 * (index - 1) / self.total)
            self.stream.write(f"\r[{'#' * done}{'.' * (20 - done)}] {index}/{self.total} {name[:50]:50}")
            self.stream.flush()

    def clear(self) -> None:
        if self.live:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()


def summary_table(results: list[CaseResult]) -> str:
    """Every case in one table: status, partitions, primitives-level detail, seconds."""
    rows = [("case", "status", "partitions", "seconds", "ms/run")]
    for r in results:
        rows.append((r.case, r.status, str(len(r.partitions)), f"{r.seconds:.2f}",
                     "" if r.ms_per_run is None else f"{r.ms_per_run:.3f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _engine_args(spec: str) -> tuple:
    kind, _, index = spec.partition(":")
    return (kind, int(index or 0))

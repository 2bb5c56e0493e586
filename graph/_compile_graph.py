"""``compile_graph``: a whole graph partitioned, compiled for one engine and bound to handlers.

    runner = await triodnn.graph.compile_graph(graph, engine, policy="fusion",
                                               handlers={"Wildcard": numpy_function})

It partitions the graph and compiles every supported partition (concurrently, each as soon as its
inputs' shapes are known). Unsupported partitions (Wildcard ops, kinds triodnn does not lower)
run through user handlers (``_handlers``). The result is a ``GraphRunner`` (``_execution``).
"""

from __future__ import annotations

import trio

from .._engine import Engine
from .._portal_route import portal_of
from .._values._errors import InvalidArgumentError, ShapeInferenceError
from ._dynamic import DynamicGraphRunner
from ._execution import GraphRunner, Step
from ._graph import Graph
from ._handlers import MissingHandlerError, find_handler, normalise_handlers
from ._layouts import resolve_input_layout, resolve_output_layout
from ._logical_tensor import LogicalTensor, known_shape
from ._partition import Partition
from ._progress import ProgressCallback, progress_callback

__all__ = ["compile_graph"]


async def _gather(functions) -> None:
    """Run the async callables concurrently; the first failure cancels the rest and is raised
    as itself (not in an exception group)."""
    failure: list[BaseException] = []

    async def guarded(fn, nursery):
        try:
            await fn()
        except Exception as exc:
            if not failure:
                failure.append(exc)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for fn in functions:
            nursery.start_soon(guarded, fn, nursery)
    if failure:
        raise failure[0]


def compile_graph(graph: Graph, engine: Engine, *, policy: str = "fusion", handlers=None,
                  inputs=None, constants=None, progress=None):
    """Partition ``graph`` with ``policy``, compile its supported partitions for ``engine`` and
    bind its unsupported ones to ``handlers``: ``runner = await compile_graph(graph, engine)``,
    a ``GraphRunner``. Given an engine of a blocking portal it compiles there and returns the
    runner, wrapped (as ``portal.run(compile_graph, graph, engine)`` does).

    ``handlers`` maps op kinds (``"Wildcard"``), partition ids or ``Partition`` objects to
    ``Handler``s or plain callables. An unsupported partition without one raises
    ``MissingHandlerError`` naming its op kinds, before anything compiles. ``inputs``, logical
    tensors as a list or a dict keyed by their ids, gives graph inputs new shapes or layouts;
    shapes are re-inferred downstream (handler outputs keep the shapes the graph declares).
    Where a partition's inputs have the shapes the graph declares (a -1 dim there taking any),
    an output shape the graph declares must agree with the inferred one, as in
    ``Partition.compile``: ``ShapeInferenceError`` naming the op and the tensor otherwise.
    ``constants``, ``{input id: array, Tensor or Memory}``, gives the runner those inputs once
    (``GraphRunner.set_constants``): its runs may omit them. A graph input whose shape stays
    unknown (a ``-1`` dim) gives a ``DynamicGraphRunner``, compiled per set of input shapes at
    their first run. ``progress`` reports each partition as it is compiled (a cold compile
    builds kernels for seconds): True for a tqdm bar where tqdm is installed (else a line on a
    terminal's stderr), or a callable ``(done, total, what)`` (``_progress``).
    """
    report = progress_callback(progress, "compile_graph")
    portal = portal_of(engine)
    if portal is not None:
        return portal.run(_compile_graph, graph, engine, policy=policy, handlers=handlers,
                          inputs=inputs, constants=constants, report=report)
    return _compile_graph(graph, engine, policy=policy, handlers=handlers, inputs=inputs, constants=constants,
                          report=report)


async def _compile_graph(graph: Graph, engine: Engine, *, policy: str, handlers, inputs,
                         constants, report: ProgressCallback | None = None) -> GraphRunner | DynamicGraphRunner:
    if not isinstance(graph, Graph):
        raise InvalidArgumentError(f"graph is {type(graph).__name__}, expected triodnn.graph.Graph")
    partitions = graph.get_partitions(policy)
    handlers = normalise_handlers(handlers, partitions)
    missing = [p for p in partitions if not p.is_supported and find_handler(p, handlers) is None]
    if missing:
        names = "; ".join(
            f"partition {p.id}: " + ", ".join(f"op {op.id} ({op.kind}, {op.name!r})" for op in p.ops)
            for p in missing
        )
        kinds = sorted({kind for p in missing for kind in p.op_kinds})
        raise MissingHandlerError(
            f"graph ops of kind {', '.join(kinds)} are not supported by triodnn and handlers has "
            f"no entry for them ({names}); pass handlers={{{kinds[0]!r}: fn}} (op kind), "
            f"{{partition_id: fn}} or {{partition: fn}}"
        )

    graph_inputs = graph.input_tensors()
    given: dict[int, LogicalTensor] = {}
    if inputs is not None:
        if isinstance(inputs, dict):
            for key, lt in inputs.items():
                if not isinstance(lt, LogicalTensor):
                    raise InvalidArgumentError(f"inputs[{key!r}] is {type(lt).__name__}, expected LogicalTensor")
                if key != lt.id:
                    raise InvalidArgumentError(
                        f"inputs[{key!r}] is logical tensor {lt.id}: keys are the tensors' ids"
                    )
            inputs = list(inputs.values())
        elif isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
            raise InvalidArgumentError(
                f"inputs is {type(inputs).__name__}; expected logical tensors, as a list or keyed by id"
            )
        for lt in inputs:
            if not isinstance(lt, LogicalTensor):
                raise InvalidArgumentError(f"inputs holds {type(lt).__name__}, expected LogicalTensor")
            given[lt.id] = lt
        unknown = sorted(set(given) - {lt.id for lt in graph_inputs})
        if unknown:
            raise InvalidArgumentError(
                f"inputs name logical tensor ids {unknown}, which are not graph inputs "
                f"{[lt.id for lt in graph_inputs]}"
            )
    if any(not given.get(lt.id, lt).is_shape_known for lt in graph_inputs):
        # Unknown dims: compiled per set of input shapes at their first run (``_dynamic``).
        shaped_inputs = tuple(given.get(lt.id, lt) for lt in graph_inputs)

        async def compile_for(shaped: list[LogicalTensor]) -> GraphRunner:
            runner = await compile_graph(graph, engine, policy=policy, handlers=handlers, inputs=shaped)
            assert isinstance(runner, GraphRunner), "every input shape is known now"
            return runner

        dynamic = DynamicGraphRunner(graph, engine, policy, handlers, shaped_inputs, compile_for)
        if constants is not None:
            await dynamic.set_constants(constants)
        return dynamic
    known: dict[int, LogicalTensor] = {}
    for lt in graph_inputs:
        lt = given.get(lt.id, lt)
        if not lt.is_shape_known:  # settled above: every input has a known shape here
            raise ShapeInferenceError(f"graph input {lt.id} has an unknown shape")
        known[lt.id] = resolve_input_layout(lt)

    available = {lt.id: trio.Event() for p in partitions for lt in p.output_ports}
    steps: dict[int, Step] = {}

    async def prepare(partition: Partition) -> None:
        for lt in partition.input_ports:
            if lt.id not in known:
                await available[lt.id].wait()
        ins = [known[lt.id] for lt in partition.input_ports]
        if partition.is_supported:
            compiled = await partition.compile(engine, ins, None)
            step = Step(partition, tuple(compiled.inputs), tuple(compiled.outputs), compiled=compiled)
        else:
            outs = []
            for lt in partition.output_ports:
                if not lt.is_shape_known:
                    op = next(op for op in partition.ops if any(o.id == lt.id for o in op.outputs))
                    raise ShapeInferenceError(
                        f"op {op.id} ({op.kind}) runs through a handler, so its output {lt.id} needs a "
                        f"declared shape; it has {'unknown' if lt.shape is None else list(lt.shape)}"
                    )
                outs.append(resolve_output_layout(lt, known_shape(lt)))
            call = partition.ops[0].inputs if len(partition.ops) == 1 else partition.input_ports
            step = Step(partition, tuple(ins), tuple(outs), handler=find_handler(partition, handlers),
                         call_ids=tuple(lt.id for lt in call))
        steps[partition.id] = step
        for lt in step.outputs:
            known[lt.id] = lt
            available[lt.id].set()
        if report is not None:
            report(len(steps), len(partitions), f"partition {partition.id}: {'+'.join(partition.op_kinds)}")

    await _gather([lambda p=p: prepare(p) for p in partitions])
    output_ids = [lt.id for lt in graph.output_tensors()]
    runner = GraphRunner(
        graph, engine, policy, tuple(partitions),
        tuple(known[lt.id] for lt in graph_inputs),
        tuple(known[i] for i in output_ids),
        steps=tuple(steps[p.id] for p in partitions),
        handlers=handlers,
    )
    if constants is not None:
        await runner.set_constants(constants)
    return runner

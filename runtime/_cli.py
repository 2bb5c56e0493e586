"""The ``triodnn`` command line: ``info`` lists devices, ``demo`` runs the async pipeline demo,
``graph`` runs, checks and times serialized oneDNN graphs, ``onnx`` ONNX models."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import trio
from pyopencl import CompilerWarning

from ._runtime import default_engine_spec, find_device, parse_engine_spec
from ._trace import record_to
from ._trace_plot import load_events
from ._trace_plot import plot as plot_trace
from ._values._errors import TriodnnError, UnusableDeviceWarning
from .actors import (
    choose_out_of_order_strategy,
    describe_device,
    list_devices,
    pip_driver_problems,
    unusable_devices,
)
from .testing import run_benchdnn_runs, run_demo
from .testing._benchdnn import parse as parse_harness
from .testing._benchdnn import trailing_options

try:  # the onnx extra: without it, `triodnn onnx` says what to install
    from .onnx import check_model as check_onnx_model
    ONNX_MISSING = ""
except ImportError as exc:
    check_onnx_model = None  # type: ignore[assignment]
    ONNX_MISSING = str(exc)


def _info(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusableDeviceWarning)  # listed below, with the reason
        records = list_devices()
        unusable = unusable_devices()
    if not records and not unusable:
        print("no OpenCL device found (is pyopencl[pocl] installed?)")
        return 1
    for record in records:
        info = describe_device(record.device)
        strategy = choose_out_of_order_strategy(
            vendor=info["vendor"], platform=info["platform"],
            compute_units=info["max_compute_units"], override=os.environ.get("TRIODNN_OOO_STRATEGY"),
        )
        print(f"{record.label:8} {info['name']}")
        print(f"         platform {info['platform']} ({info['platform_version']}), driver {info['driver']}")
        print(f"         {info['max_compute_units']} compute units, "
              f"{info['global_mem_size'] / 2**30:.1f} GiB, max work-group {info['max_work_group_size']}")
        lanes = f" ({strategy.lanes} lanes)" if strategy.kind == "lanes" else ""
        print(f"         out-of-order streams: {strategy.kind}{lanes}: {strategy.reason}")
    for device in unusable:
        print(f"{'unusable':8} {device.name}")
        print(f"         {device.reason}")
    for problem in pip_driver_problems():
        print(f"{'note':8} {problem}")
    spec = default_engine_spec()
    try:
        find_device(*parse_engine_spec(spec))
    except TriodnnError as exc:
        print(f"default engine: none ({type(exc).__name__}: {exc})")
        return 1
    print(f"default engine: {spec}")
    return 0


def _trace_command(args: argparse.Namespace) -> int:
    """A saved trace drawn as a Gantt chart (``triodnn.trace.plot``)."""
    try:
        events = load_events(args.file)
    except (OSError, ValueError) as exc:
        print(f"triodnn trace: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    out = args.output or str(Path(args.file).with_suffix(".png"))
    plot_trace(events, out, show=args.show.split(","), arrows=not args.no_arrows)
    print(f"triodnn trace: drew {args.file} to {out}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    _set_verbose(args.verbose)
    passed = trio.run(run_demo, args.engine, args.size, args.requests, args.in_flight, args.rounds)
    return 0 if passed else 1


def _set_verbose(level: int | None) -> None:
    """``--verbose N`` is ``TRIODNN_VERBOSE=N`` (1: a line per primitive creation, 2: and per
    execution with its device time)."""
    if level is not None:
        os.environ["TRIODNN_VERBOSE"] = str(level)


def _graph(args: argparse.Namespace) -> int:
    """benchdnn's graph driver, whatever the options' order: the words are read in order, each
    option applying to the cases after it; every run prints benchdnn's line. An input error (an
    unknown option, a malformed value, a case file that is not there) exits 2 before anything
    runs; a FAILED run exits 1."""
    _set_verbose(args.verbose)
    for option in trailing_options(args.tokens):
        # benchdnn would ignore it silently; a user who wrote --case=F --mode=P wanted it applied.
        print(f"triodnn graph: warning: {option} comes after the last --case/--batch and applies to no case "
              "(options apply to the cases after them: put it first)", file=sys.stderr)
    runs = parse_harness(args.tokens, base=Path.cwd())
    if not runs:
        print("triodnn graph: give --case FILE or --batch DIR|HARNESS", file=sys.stderr)
        return 2
    with record_to(args.trace):
        results = trio.run(lambda: run_benchdnn_runs(runs, engine_spec=args.engine, policy=args.policy,
                                                     repeat=args.repeat))
    return 1 if any(r.status == "FAILED" for r in results) else 0


def _onnx(args: argparse.Namespace) -> int:
    """An ONNX model checked against the data sets beside it (or ONNX Runtime, else ONNX's reference
    evaluator) and timed; one line per data set, then the timing and the totals. A FAILED data set
    exits 1."""
    if check_onnx_model is None:
        print(f"triodnn onnx: needs the onnx package (pip install 'triodnn[onnx]'): {ONNX_MISSING}", file=sys.stderr)
        return 2
    shapes = {}
    for item in args.input_shape or ():
        name, _, dims = item.rpartition(":")
        try:
            shapes[name] = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            print(f"triodnn onnx: --input-shape {item!r} is not NAME:AxBxC", file=sys.stderr)
            return 2
    _set_verbose(args.verbose)
    result = trio.run(lambda: check_onnx_model(args.model, engine_spec=args.engine, mode=args.mode,
                                               repeat=args.repeat, input_shapes=shapes, batch=args.batch))
    for i, check in enumerate(result.data_sets):
        status = "PASSED" if check.passed else "FAILED"
        detail = f"; {check.detail}" if check.detail else ""
        print(f"{i}:{status} {args.model} {check.name}: max abs error {check.max_abs_error:.3g}{detail}")
    if result.times_ms:
        times = result.times_ms
        print(f"perf: {args.model} on {result.engine}: min {min(times):.3f} ms avg {sum(times) / len(times):.3f} ms "
              f"over {len(times)} runs, each awaited")
    if result.wildcard_ops:
        print(f"note: {result.wildcard_ops} node(s) without a converter ran through ONNX's reference evaluator")
    failed = sum(not c.passed for c in result.data_sets)
    print(f"tests:{len(result.data_sets)} passed:{len(result.data_sets) - failed} failed:{failed}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="triodnn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="list the OpenCL devices triodnn can use")
    info.set_defaults(run=_info)
    demo = commands.add_parser("demo", help="run an async pipeline of primitives and check it")
    demo.add_argument("--engine", help="KIND[:INDEX], e.g. cpu:0 or gpu:0 (default: $TRIODNN_ENGINE or cpu:0)")
    demo.add_argument("--size", type=int, default=1 << 18, help="elements per request (default 262144)")
    demo.add_argument("--requests", type=int, default=16, help="requests per round (default 16)")
    demo.add_argument("--in-flight", type=int, default=4, help="requests in flight at once (default 4)")
    demo.add_argument("--rounds", type=int, default=3, help="timed rounds per stream kind (default 3)")
    demo.add_argument("--verbose", type=int, choices=(0, 1, 2), help="TRIODNN_VERBOSE level for this run")
    demo.set_defaults(run=_demo)
    trace = commands.add_parser("trace", help="draw a saved trace (triodnn graph --trace, Trace.save) as a Gantt chart")
    trace.add_argument("file", help="a trace JSON file")
    trace.add_argument("-o", "--output", metavar="IMAGE", help="PNG, SVG or PDF to write (default: FILE with .png)")
    trace.add_argument("--show", default="device", metavar="ROWS",
                       help="rows to draw, comma separated: device (lanes, the default), host, tasks")
    trace.add_argument("--no-arrows", action="store_true", help="leave out the dependency arrows")
    trace.set_defaults(run=_trace_command)
    graph = commands.add_parser(
        "graph", help="run, check (--mode C) or time (--mode P) oneDNN graph JSON, as benchdnn's graph driver",
        description="benchdnn's graph driver: the options are read in order, each applying to the --case and "
                    "--batch after it (until --reset); a comma list runs once per value. Each run prints "
                    "benchdnn's line, then 'tests:N passed:N ...'. Input errors exit 2, a FAILED run 1.")
    graph.add_argument("--case", action="append", metavar="FILE", help="a serialized graph (repeatable)")
    graph.add_argument("--batch", action="append", metavar="DIR|HARNESS",
                       help="every *.json in DIR, or a benchdnn harness file (options and --case lines)")
    graph.add_argument("--mode", action="append", metavar="C|P|CP|L",
                       help="C: check against a float64 numpy reference (default); P: time per run; CP: both; "
                            "L: list the runs, run nothing")
    graph.add_argument("--engine", help="KIND[:INDEX], e.g. cpu or gpu:0 (default: $TRIODNN_ENGINE or cpu:0)")
    graph.add_argument("--policy", choices=("fusion", "debug"), default="fusion",
                       help="fusion: oneDNN's fused partitions (default); debug: one partition per op")
    graph.add_argument("--in-shapes", action="append", metavar="ID:AxB[*TAG]+...",
                       help="new shapes (and layouts) for graph inputs; the graph is re-inferred")
    graph.add_argument("--dt", action="append", metavar="DT|ID:DT+...",
                       help="data type of every floating tensor (f32, bf16, f16), or per tensor id")
    graph.add_argument("--expected-n-partitions", action="append", metavar="N",
                       help="partitions the graph must give (default 1; 0 skips the check)")
    graph.add_argument("--reset", action="append_const", const=True, help="options back to benchdnn's defaults")
    graph.add_argument("--mb", action="append", metavar="N", help="minibatch of the graph inputs (0: as written)")
    graph.add_argument("--op-attrs", action="append", metavar="ID:NAME:VALUE[*NAME:VALUE][+ID:...]",
                       help="set attributes of op ID, typed as the graph's attribute; VALUE undef removes one")
    graph.add_argument("--op-kind", action="append", metavar="ID:KIND[+ID:KIND]",
                       help="change op ID's kind; KIND undef removes the op (its input flows on)")
    graph.add_argument("--tensor-property", action="append", metavar="ID:constant|variable|host_scalar|undef[+...]",
                       help="a logical tensor's property: constant inputs go through the constant tensor cache")
    graph.add_argument("--attr-fpmath", action="append", metavar="MODE[:APPLY_TO_INT]",
                       help="the graph's fpmath mode (strict, bf16, f16, tf32, any; APPLY_TO_INT true or false), "
                            "written into the graph; triodnn computes in strict f32 whatever it allows")
    graph.add_argument("--repeat", type=int, default=20, help="timed runs in --mode P (default 20)")
    graph.add_argument("--trace", metavar="FILE",
                       help="record a trace of the run to FILE (Chrome JSON: ui.perfetto.dev, chrome://tracing)")
    graph.add_argument("--verbose", type=int, choices=(0, 1, 2), help="TRIODNN_VERBOSE level for this run")
    graph.set_defaults(run=_graph)
    onnx_command = commands.add_parser(
        "onnx", help="check (--mode C) or time (--mode P) an ONNX model",
        description="Runs MODEL on the data sets beside it (test_data_set_N/input_K.pb, output_K.pb, as ONNX's "
                    "model directories keep them) and compares with their outputs (rtol 1e-3, atol 1e-7); "
                    "without data sets, on drawn inputs against ONNX Runtime where installed, else ONNX's reference "
                    "evaluator. Input errors exit 2, "
                    "a FAILED data set 1. Needs the onnx extra.")
    onnx_command.add_argument("model", help="an ONNX model file")
    onnx_command.add_argument("--engine", help="KIND[:INDEX], e.g. cpu or gpu:0 (default: $TRIODNN_ENGINE or cpu:0)")
    onnx_command.add_argument("--mode", choices=("C", "P", "CP"), default="C",
                              help="C: check the outputs (default); P: time runs; CP: both")
    onnx_command.add_argument("--repeat", type=int, default=20, help="timed runs in --mode P (default 20)")
    onnx_command.add_argument("--batch", type=int, metavar="N",
                              help="run each data set's sample N times in one request (inputs of batch 1 "
                                   "repeated along the first dim; the model's batch dim must be symbolic)")
    onnx_command.add_argument("--input-shape", action="append", metavar="NAME:AxBxC",
                              help="fix the shape of an input the model leaves symbolic (repeatable)")
    onnx_command.add_argument("--verbose", type=int, choices=(0, 1, 2), help="TRIODNN_VERBOSE level for this run")
    onnx_command.set_defaults(run=_onnx)
    args = parser.parse_args(argv)
    if args.command == "graph":
        # benchdnn reads its options in order; argparse does not keep it.
        words = list(sys.argv[1:] if argv is None else argv)
        args.tokens = words[words.index("graph") + 1:]
    if not sys.warnoptions:
        # The command owns its process: kernel build logs (PoCL on AMD Zen 4 warns on every
        # float16 function argument) are not the user's to act on. Any -W option keeps them:
        # `PYOPENCL_COMPILER_OUTPUT=1 python -W default -m triodnn._cli ...` prints them whole.
        warnings.filterwarnings("ignore", category=CompilerWarning)

    try:
        return args.run(args)
    except TriodnnError as exc:
        print(f"triodnn: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``triodnn`` command line: ``info`` lists devices, ``demo`` runs the async pipeline demo,
``graph`` runs, checks and times serialized oneDNN graphs."""

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
from ._values._errors import TriodnnError, UnusableDeviceWarning
from .actors import (
    choose_out_of_order_strategy,
    describe_device,
    list_devices,
    pip_driver_problems,
    unusable_devices,
)
from .testing import run_benchdnn_runs, run_cases, run_demo
from .testing._benchdnn import parse as parse_harness


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


def _demo(args: argparse.Namespace) -> int:
    _set_verbose(args.verbose)
    passed = trio.run(run_demo, args.engine, args.size, args.requests, args.in_flight, args.rounds)
    return 0 if passed else 1


def _set_verbose(level: int | None) -> None:
    """``--verbose N`` is ``TRIODNN_VERBOSE=N`` (1: a line per primitive creation, 2: and per
    execution with its device time)."""
    if level is not None:
        os.environ["TRIODNN_VERBOSE"] = str(level)


# Options only benchdnn's language has: any of them (or a --batch naming a harness file) makes
# the command line a benchdnn one, read in order (options before a --case or --batch apply to it).
_BENCHDNN_ONLY = ("--reset", "--mb", "--op-attrs", "--op-kind", "--tensor-property", "--attr-fpmath")


def _is_benchdnn(args: argparse.Namespace) -> bool:
    words = args.tokens
    return (args.mode == "CP" or any(Path(b).is_file() for b in args.batch or [])
            or any(w.split("=", 1)[0] in _BENCHDNN_ONLY for w in words)
            or any("," in w for w in words if w.startswith(("--in-shapes", "--dt", "--mode",
                                                              "--expected-n-partitions"))))


def _harness(args: argparse.Namespace) -> int:
    runs = parse_harness(args.tokens, base=Path.cwd())
    if not runs:
        print("triodnn graph: no --case to run", file=sys.stderr)
        return 2
    with record_to(args.trace):
        results = trio.run(lambda: run_benchdnn_runs(runs, engine_spec=args.engine, policy=args.policy,
                                                     repeat=args.repeat))
    return 1 if any(r.status == "FAILED" for r in results) else 0


def _graph(args: argparse.Namespace) -> int:
    _set_verbose(args.verbose)
    if _is_benchdnn(args):
        return _harness(args)
    paths = [Path(p) for p in args.case or []]
    for batch in args.batch or []:
        paths += sorted(Path(batch).glob("*.json"))
    if not paths:
        print("triodnn graph: give --case FILE or --batch DIR|HARNESS", file=sys.stderr)
        return 2
    if args.mode not in ("C", "P"):
        print(f"triodnn graph: --mode={args.mode}: not one of C, P, CP", file=sys.stderr)
        return 2
    expected = args.expected_n_partitions
    if expected is not None and not expected.isdigit():
        print(f"triodnn graph: --expected-n-partitions={expected}: not a non-negative integer", file=sys.stderr)
        return 2
    expected = None if expected is None else int(expected)
    with record_to(args.trace):
        results = trio.run(lambda: run_cases(
            paths, engine_spec=args.engine, mode=args.mode.upper(), policy=args.policy,
            in_shapes=args.in_shapes, dt=args.dt, expected_n_partitions=expected,
            repeat=args.repeat))
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    print("tests:", len(results), " ".join(f"{k.lower()}: {v}" for k, v in sorted(counts.items())))
    return 1 if any(r.status == "FAILED" for r in results) else 0


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
    graph = commands.add_parser("graph", help="run, check (--mode C) or time (--mode P) oneDNN graph JSON")
    graph.add_argument("--case", action="append", metavar="FILE", help="a serialized graph (repeatable)")
    graph.add_argument("--batch", action="append", metavar="DIR|HARNESS",
                       help="every *.json in DIR, or a benchdnn harness file (options and --case lines)")
    graph.add_argument("--mode", type=str.upper, default="C", metavar="C|P|CP",
                       help="C: check against numpy (default); P: time per run; CP: both (benchdnn runs; a "
                            "comma list runs each)")
    graph.add_argument("--engine", help="KIND[:INDEX], e.g. cpu or gpu:0 (default: $TRIODNN_ENGINE or cpu:0)")
    graph.add_argument("--policy", choices=("fusion", "debug"), default="fusion")
    graph.add_argument("--in-shapes", metavar="ID:AxB+...", help="new shapes for graph inputs")
    graph.add_argument("--dt", metavar="DT|ID:DT+...", help="data type of every floating tensor, or per id")
    graph.add_argument("--expected-n-partitions", metavar="N",
                       help="partitions the graph must give (benchdnn runs: default 1, 0 skips the check)")
    # benchdnn's graph knobs; any of them reads the command line as benchdnn does (in order,
    # comma lists as alternatives). argparse only lists them here; _benchdnn parses them.
    graph.add_argument("--reset", action="append_const", const=True, help="options back to benchdnn's defaults")
    graph.add_argument("--mb", action="append", metavar="N", help="minibatch of the graph inputs (0: as written)")
    graph.add_argument("--op-attrs", action="append", metavar="ID:NAME:VALUE[*NAME:VALUE][+ID:...]")
    graph.add_argument("--op-kind", action="append", metavar="ID:KIND[+ID:KIND]",
                       help="KIND undef removes the op")
    graph.add_argument("--tensor-property", action="append", metavar="ID:constant|variable|host_scalar|undef[+...]")
    graph.add_argument("--attr-fpmath", action="append", metavar="MODE[:APPLY_TO_INT]")
    graph.add_argument("--repeat", type=int, default=20, help="timed runs in --mode P (default 20)")
    graph.add_argument("--trace", metavar="FILE",
                       help="record a trace of the run to FILE (Chrome JSON: ui.perfetto.dev, chrome://tracing)")
    graph.add_argument("--verbose", type=int, choices=(0, 1, 2), help="TRIODNN_VERBOSE level for this run")
    graph.set_defaults(run=_graph)
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

"""bench_pool: one request stream over several engines (``EnginePool.map``) against the first
engine alone.

For bench_graph's MLP (64x1024 x3; ``--mlp-batch`` rows) and SDPA (1x8x128x64; ``--sdpa-seq``),
fused: N requests through a pool of the first engine alone, then through a pool of every engine
given, each compiled with ``compile_graph_pool`` (capacity requests in flight per engine). The
MLP's weights and biases and the SDPA's scale and mask are given once per engine
(``constants``), as a serving process would; each request brings the rest. Timing: wall time of the whole
stream of N requests (pulled as the pipeline's backpressure allows, awaited in input order), the
two variants alternating, median of R; throughput = N / time. Every request's outputs, in every
stream, are checked against numpy's float64 reference once the stream's clock has stopped (four
input sets in turn). A repeated
engine spec (``cpu:0,cpu:0``) opens the same device again in a context of its own: a separate
engine, as a second card would be, but the same silicon.

    python benchmarks/bench_pool.py --engines gpu:0,gpu:1            # two GPUs
    python benchmarks/bench_pool.py --engines gpu:0,cpu:0            # a GPU and PoCL
    python benchmarks/bench_pool.py --engines cpu:0,cpu:0 --quick    # the code path, any machine

With ``--batch B``, two more variants: the same N requests from 4 x B concurrent requesters
through a ``DynamicBatcher`` (``max_batch=B``) over the first engine's pool and over the whole
pool, the batchers opened (every batch size compiled) before timing; their results are checked
the same way.
"""

from __future__ import annotations

import contextlib
import time

import _common as common
import bench_graph
import pyopencl as cl
import trio

import triodnn
from triodnn import ocl_interop
from triodnn.graph import DynamicBatcher, compile_graph_pool
from triodnn.testing import make_inputs


def extra_args(parser) -> None:
    parser.add_argument("--engines", default="cpu:0,cpu:0", help="engine specs, comma-separated (first: the baseline)")
    parser.add_argument("--requests", type=int, default=None, help="requests per stream, N (default 200, quick 20)")
    parser.add_argument("--reps", type=int, default=None, help="streams per variant, R (default 5, quick 2)")
    parser.add_argument("--capacity", type=int, default=4, help="requests in flight per engine")
    parser.add_argument("--case", action="append", choices=("mlp", "sdpa"), help="graph (repeatable; default both)")
    parser.add_argument("--mlp-batch", type=int, default=64, help="MLP rows per request (default 64)")
    parser.add_argument("--sdpa-seq", type=int, default=128, help="SDPA sequence length (default 128)")
    parser.add_argument("--batch", type=int, default=0, help="also dynamic batching, max_batch B (default off)")


# Inputs given once per engine (set_constants), as a serving process would: the MLP's weights
# and biases, the SDPA's scale and mask; every request brings the rest.
CONSTANTS = {"mlp": lambda ids: ids[1:], "sdpa": lambda ids: ids[3:]}


def serving_inputs(case: str, graph, n_sets: int = 4) -> tuple[dict, list, list]:
    """(constants, request input sets, their references): CONSTANTS[case]'s inputs once, then
    ``n_sets`` requests of the other inputs, each with numpy's float64 reference of the graph."""
    constant_ids = CONSTANTS[case](sorted(lt.id for lt in graph.input_tensors()))
    first = make_inputs(graph, seed=0)
    constants = {i: first[i] for i in constant_ids}
    full = [{**make_inputs(graph, seed=s), **constants} for s in range(n_sets)]
    refs = [bench_graph.graph_reference(graph, arrays) for arrays in full]
    return constants, [{i: a for i, a in arrays.items() if i not in constants} for arrays in full], refs


async def open_engines(runtime, specs: list[str]) -> list:
    engines, seen = [], set()
    for spec in specs:
        kind, _, index = spec.partition(":")
        engine = await runtime.engine(kind, int(index or 0))
        if id(engine) in seen:  # the same device again: a context of its own
            engine = await ocl_interop.make_engine(engine.cl_device, cl.Context([engine.cl_device]))
        seen.add(id(engine))
        engines.append(engine)
    return engines


async def run(args):
    n = args.requests or (20 if args.quick else 200)
    reps = args.reps or (2 if args.quick else 5)
    results, rows, batched_rows = {}, [], []
    async with triodnn.open_runtime() as rt:
        engines = await open_engines(rt, [s.strip() for s in args.engines.split(",")])
        common.print_header("bench_pool: EnginePool.map over several engines vs the first alone", engines[0], args, [
            f"engines: {', '.join(str(e) + ' ' + e.info.name.strip() for e in engines)}",
            f"timing: wall time of a stream of {n} requests (capacity {args.capacity} per engine), "
            f"variants alternating, median of {reps}"])
        for case in args.case or ["mlp", "sdpa"]:
            graph = (bench_graph.mlp(batch=args.mlp_batch) if case == "mlp" else
                     bench_graph.sdpa(s=args.sdpa_seq))
            constants, sets, refs = serving_inputs(case, graph)
            out_ids = [lt.id for lt in graph.output_tensors()]
            pools = {
                "one": await compile_graph_pool(graph, engines[:1], capacity=args.capacity, constants=constants),
                "pool": await compile_graph_pool(graph, engines, capacity=args.capacity, constants=constants),
            }

            def check(name: str, got: list) -> None:
                assert len(got) == n, f"{name}: {len(got)} results of {n}"
                for i, result in enumerate(got):
                    outputs = result if isinstance(result, dict) else result.unwrap()
                    for lt_id in out_ids:
                        problem = bench_graph.mismatch(graph, refs[i % len(refs)], lt_id, outputs[lt_id])
                        if problem:
                            raise SystemExit(f"{case}, {name}, request {i}: {problem}")

            def variant(name):
                async def sample():
                    got = []
                    t0 = time.perf_counter()
                    async with pools[name].map(sets[i % len(sets)] for i in range(n)) as stream_results:
                        async for result in stream_results:
                            got.append(result)
                    elapsed = time.perf_counter() - t0
                    check(name, got)  # every stream, after its clock stopped
                    return elapsed
                return sample

            variants = {"one": variant("one"), "pool": variant("pool")}
            async with contextlib.AsyncExitStack() as batchers:
                if args.batch:
                    for name in ("one", "pool"):
                        batcher = await batchers.enter_async_context(
                            DynamicBatcher(pools[name], max_batch=args.batch))
                        variants[f"{name}, batched"] = batched(f"{name}, batched", batcher, n, sets, check)
                for fn in variants.values():  # warm every variant (first launches), then time
                    await fn()
                samples = await common.interleaved(variants, reps)
            t_one, t_pool = common.median(samples["one"]), common.median(samples["pool"])
            if args.batch:
                t_b1, t_bp = common.median(samples["one, batched"]), common.median(samples["pool, batched"])
                batched_rows.append([label_of(case, args), n / t_b1, n / t_bp, t_b1 / t_bp, n / t_one])
                results[f"{case}_batched"] = {"one_req_per_s": n / t_b1, "pool_req_per_s": n / t_bp,
                                              "speedup": t_b1 / t_bp}
            share = [s.routed for s in pools["pool"].statistics().engines]
            label = label_of(case, args)
            rows.append([label, n / t_one, n / t_pool, t_one / t_pool, "/".join(map(str, share))])
            results[case] = {"one_req_per_s": n / t_one, "pool_req_per_s": n / t_pool, "speedup": t_one / t_pool,
                             "routed": share}
        common.print_table(["graph", "first engine req/s", "pool req/s", "pool ÷ one", "requests per engine (pool)"],
                           rows)
        if batched_rows:
            common.print_table(["graph", "first engine, batched req/s", "pool, batched req/s", "pool ÷ one",
                                "first engine unbatched req/s"], batched_rows,
                               f"Dynamic batching (max_batch {args.batch}, {4 * args.batch} requesters)")
        return results, engines[0]


def label_of(case: str, args) -> str:
    return f"mlp {args.mlp_batch}x1024 x3" if case == "mlp" else f"sdpa 1x8x{args.sdpa_seq}x64"


def batched(name: str, batcher, n: int, sets: list, check):
    """A sample: N requests from 4 x max_batch requesters through ``batcher``; wall time."""
    async def sample():
        got: list = [None] * n
        order = iter(range(n))

        async def requester():
            for i in order:
                got[i] = await batcher.run(sets[i % len(sets)])

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(4 * batcher.max_batch):
                nursery.start_soon(requester)
        elapsed = time.perf_counter() - t0
        check(name, got)
        return elapsed
    return sample


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_pool", engine, args, results)


if __name__ == "__main__":
    main()

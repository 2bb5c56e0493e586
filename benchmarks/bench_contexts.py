"""bench_contexts: what an OpenCL context costs on a GPU driver, and how many one process gets.

Times the first context and five more created one after another, 12 created at once from 12
threads, and 12 trio runs each opening a triodnn runtime and engine and creating a relu at once;
then creates contexts until the driver refuses one (at most 200). Resident memory is printed
after each stage. Run several copies at once to see the limit shared between processes:

    python benchmarks/bench_contexts.py
    for k in 1 2 3 4; do python benchmarks/bench_contexts.py & done; wait

Measured on an H200 (driver 580), 2026-11-28: the first context 446 ms, the next ones 161-175 ms
and ~88 MiB of resident memory each; 12 at once 2.4 s of wall time (the driver creates them one
at a time); 100 held before OUT_OF_HOST_MEMORY alone, 18-50 each with four copies running.
"""

from __future__ import annotations

import threading
import time

import pyopencl as cl
import trio

import triodnn


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def at_once(count: int, fn) -> tuple[float, list[float]]:
    """Wall time of ``fn(i)`` for ``count`` threads started together, and each one's time."""
    times = [0.0] * count

    def run(i: int) -> None:
        started = time.perf_counter()
        fn(i)
        times[i] = time.perf_counter() - started

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, sorted(times)


def open_runtime_and_build(i: int) -> float:
    async def one() -> float:
        async with triodnn.open_runtime() as rt:
            started = time.perf_counter()
            engine = await rt.engine("gpu", 0)
            opened = time.perf_counter() - started
            await engine.create_primitive(triodnn.EltwiseDesc("relu", triodnn.MemoryDesc((301 + i,), "f32")))
            return opened

    return trio.run(one)


def main() -> None:
    device = next(d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU)
    started = time.perf_counter()
    kept = [cl.Context([device])]
    print(f"first context {1e3 * (time.perf_counter() - started):.0f} ms, rss {rss_mib():.0f} MiB")
    for i in range(5):
        started = time.perf_counter()
        kept.append(cl.Context([device]))
        print(f"context {i} {1e3 * (time.perf_counter() - started):.1f} ms, rss {rss_mib():.0f} MiB")
    wall, each = at_once(12, lambda i: kept.append(cl.Context([device])))
    print(f"12 contexts at once: wall {wall * 1e3:.0f} ms, each {[round(t * 1e3) for t in each]}, "
          f"rss {rss_mib():.0f} MiB")
    kept.clear()
    opens: dict[int, float] = {}
    wall, each = at_once(12, lambda i: opens.__setitem__(i, open_runtime_and_build(i)))
    print(f"12 runtimes + engine + relu at once: wall {wall * 1e3:.0f} ms, each {[round(t * 1e3) for t in each]}; "
          f"engine opens {[round(t * 1e3) for t in sorted(opens.values())]} ms")
    held = 0
    try:
        while held < 200:
            kept.append(cl.Context([device]))
            held += 1
    except cl.Error as exc:
        print(f"context {held} refused: {exc}")
    print(f"held {held} contexts, rss {rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()

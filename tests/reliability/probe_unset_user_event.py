"""Does releasing a context with a never-completed UserEvent block? (RELIABILITY.md: on NVIDIA it
does, forever, with the GIL held.) Run by hand on a machine with an OpenCL GPU:
``timeout 30 python tests/reliability/probe_unset_user_event.py``. Each step reports whether it
returned within 5 s; a step that blocks with the GIL held stops the whole process, its output
included (no watchdog thread could run either), hence the ``timeout``. Seen on an H100: the first
two steps return, the third prints nothing."""

from __future__ import annotations

import os
import threading

import pyopencl as cl


def step(name: str, action) -> None:
    done = threading.Event()

    def run() -> None:
        action()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    print(f"{name}: returned within 5 s: {done.wait(5)}", flush=True)


def main() -> None:
    device = next(d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU)
    held: dict = {}
    step("make a context and a user event", lambda: held.update(ctx=cl.Context([device]))
         or held.update(event=cl.UserEvent(held["ctx"])))
    step("drop the never-completed user event", lambda: held.pop("event"))
    step("drop its context", lambda: held.pop("ctx"))
    os._exit(0)


if __name__ == "__main__":
    main()

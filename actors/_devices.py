"""Discovery of the OpenCL devices an engine can run on, and the probe that tells a device whose
compiler cannot build from one that can."""

from __future__ import annotations

import os
import threading
import warnings

import attrs
import pyopencl as cl

from .._values._errors import UnusableDeviceWarning
from ._context_pool import context_pool
from ._icd import pip_driver_problems, register_pip_drivers

# Before any OpenCL call of the process: the ICD loader reads its list of drivers once, and
# Intel's CPU runtime from PyPI is on it only once registered (see ``_icd``). At import, so that
# a program's own pyopencl calls (interop) see the same platforms as triodnn's engines.
register_pip_drivers()

_KINDS = {cl.device_type.CPU: "cpu", cl.device_type.GPU: "gpu"}


@attrs.frozen
class DeviceRecord:
    """One usable device, its kind (``cpu``, ``gpu`` or ``accelerator``) and index within the kind."""

    kind: str
    index: int
    device: cl.Device = attrs.field(eq=False)
    platform: cl.Platform = attrs.field(eq=False)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.index}"


def device_kind(device: cl.Device) -> str:
    if device.type & cl.device_type.CPU and device.type & cl.device_type.GPU:
        # A simulator claiming every type (Oclgrind) is neither the CPU engine nor a GPU one.
        return "accelerator"
    for flag, kind in _KINDS.items():
        if device.type & flag:
            return kind
    return "accelerator"


# CPU runtimes in the order ``cpu:0``, ``cpu:1`` … take them where several are registered and
# working; a runtime not named here comes after these, in the loader's order. The order is the
# measured one (BENCHMARKS.md, the CPU runtimes side by side).
CPU_RUNTIME_ORDER = ("Portable Computing Language", "Intel(R) OpenCL")
# Short names for ``$TRIODNN_CPU_RUNTIME``, which puts one runtime first (cpu:0) for a process
# and its children: how the test suite and the benchmarks run on each CPU runtime in turn.
CPU_RUNTIME_NAMES = {"pocl": "Portable Computing Language", "intel": "Intel(R) OpenCL"}
CPU_RUNTIME_ENV = "TRIODNN_CPU_RUNTIME"


def cpu_runtime_rank(platform_name: str) -> int:
    """Where a CPU runtime's devices count among the CPU devices (lower first)."""
    name = platform_name.strip()
    first = CPU_RUNTIME_NAMES.get(os.environ.get(CPU_RUNTIME_ENV, "").strip().lower())
    if name == first:
        return -1
    return CPU_RUNTIME_ORDER.index(name) if name in CPU_RUNTIME_ORDER else len(CPU_RUNTIME_ORDER)


def registered_devices() -> list[tuple[cl.Device, cl.Platform]]:
    """Every device of every platform, CPU runtimes in ``CPU_RUNTIME_ORDER``, the rest in the
    loader's platform order; an empty or failing platform is skipped."""
    found: list[tuple[cl.Device, cl.Platform]] = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return found
    for platform in platforms:
        try:
            found.extend((device, platform) for device in platform.get_devices())
        except cl.Error:
            continue

    # CPU devices are reordered among the places CPU devices hold; the other kinds keep theirs.
    slots = [i for i, (device, _) in enumerate(found) if device_kind(device) == "cpu"]
    ranked = sorted((found[i] for i in slots), key=lambda item: cpu_runtime_rank(item[1].name))
    for slot, item in zip(slots, ranked):
        found[slot] = item
    return found


def list_devices(kind: str | None = None, *, limit: int | None = None) -> list[DeviceRecord]:
    """The usable devices, each labelled ``kind:index`` with indices counted among usable
    devices of its kind. ``kind`` keeps one kind; ``limit`` stops after that many records,
    so that finding ``cpu:0`` probes no CPU device after the first one that works.

    A CPU device is usable when its compiler builds a two-line probe (``probe_device``); a device
    that cannot is left out, with one ``UnusableDeviceWarning``. Blocking on a CPU device's first
    probe in the process (0.1-1 s): call from a worker thread in async code.
    """
    records: list[DeviceRecord] = []
    counts: dict[str, int] = {}
    for device, platform in registered_devices():
        if limit is not None and len(records) >= limit:
            break
        device_type = device_kind(device)
        if kind is not None and device_type != kind:
            continue
        if not probe_device(device).usable:
            continue
        index = counts.get(device_type, 0)
        counts[device_type] = index + 1
        records.append(DeviceRecord(device_type, index, device, platform))
    return records


@attrs.frozen
class UnusableDevice:
    """A registered device triodnn leaves out, and why (the compiler's message, and the fix)."""

    device: cl.Device = attrs.field(eq=False)
    platform: cl.Platform = attrs.field(eq=False)
    reason: str

    @property
    def name(self) -> str:
        return f"{self.device.name.strip()} ({self.platform.name.strip()})"


def unusable_devices() -> list[UnusableDevice]:
    """Every registered device whose probe failed (probing every CPU device not probed yet)."""
    return [UnusableDevice(device, platform, probe.reason)
            for device, platform in registered_devices()
            if not (probe := probe_device(device)).usable]


def setup_problems() -> list[str]:
    """What keeps a CPU engine from working here, one line each: unusable devices and pip
    drivers installed but not registered. Empty where all is well."""
    return [f"{u.name}: {u.reason}" for u in unusable_devices()] + pip_driver_problems()


def describe_device(device: cl.Device) -> dict:
    """Plain facts of a device, read once: what engines, policies and kernels decide from."""
    platform = device.platform
    return {
        "name": device.name.strip(),
        "vendor": device.vendor.strip(),
        "platform": platform.name.strip(),
        "platform_version": platform.version.strip(),
        "driver": device.driver_version.strip(),
        "version": device.version.strip(),
        "type": device_kind(device),
        "max_compute_units": int(device.max_compute_units),
        "max_work_group_size": int(device.max_work_group_size),
        "global_mem_size": int(device.global_mem_size),
        "local_mem_size": int(device.local_mem_size),
        "queue_properties": int(device.queue_properties),
        "single_fp_config": int(device.single_fp_config),
        "extensions": tuple(sorted(device.extensions.split())),
        "native_vector_width": int(device.native_vector_width_float),
        "nvidia_sm": _nvidia_sm(device),
    }


def _nvidia_sm(device: cl.Device) -> int:
    """NVIDIA's compute capability as major * 10 + minor, 0 for devices without
    ``cl_nv_device_attribute_query``."""
    if "cl_nv_device_attribute_query" not in device.extensions.split():
        return 0
    return int(device.compute_capability_major_nv) * 10 + int(device.compute_capability_minor_nv)


# A call with a float16 argument, which the probe below compiles (never runs). To a function of
# its own, not a built-in: PoCL 3.0 aborts the process when it releases the context of a program
# it loaded from its disk cache that calls a built-in across the mismatch.
_FLOAT16_CALL_PROBE = (
    "static float16 triodnn_twice(float16 x) { return x + x; }\n"
    "__kernel void triodnn_float16_call(__global float16* x) { x[0] = triodnn_twice(x[0]); }\n"
)


@attrs.frozen
class DeviceProbe:
    """What one tiny build told of a device's compiler.

    ``usable``: it builds at all (PyPI's PoCL, LLVM 14, cannot on CPUs LLVM 14 does not know,
    such as AMD's Zen 5: every build stops with "unknown target CPU 'generic'"). ``reason``: the
    compiler's message and the fix where it cannot. ``splits_float16_calls``: see
    ``float16_calls_split``."""

    usable: bool
    reason: str = ""
    splits_float16_calls: bool = False


_USABLE = DeviceProbe(True)
_probes: dict[tuple[str, ...], DeviceProbe] = {}
# Held across a probe's build: threads opening engines at once (a thread per runtime) wait for
# the one build instead of each building the probe.
_probe_lock = threading.Lock()


def _device_key(device: cl.Device) -> tuple[str, ...]:
    return (device.platform.name, device.platform.version, device.name, device.driver_version)


def probe_device(device: cl.Device) -> DeviceProbe:
    """Build the probe on a CPU device, once per device per process (other kinds are taken as
    they are: their compilers are the vendors' own). A failed build warns once, naming the
    device, the compiler's message and the fix. Blocking: 0.1 s from PoCL's kernel cache, up to
    1 s without it."""
    key = _device_key(device)
    with _probe_lock:
        if key not in _probes:
            _probes[key] = build_probe(device) if device_kind(device) == "cpu" else _USABLE
            if not _probes[key].usable:
                warnings.warn(
                    f"triodnn leaves out the OpenCL device {device.name.strip()} "
                    f"({device.platform.name.strip()}): {_probes[key].reason}",
                    UnusableDeviceWarning, stacklevel=2,
                )
        return _probes[key]


def vouch_for(device: cl.Device, splits_float16_calls: bool) -> None:
    """Take ``device``'s compiler as working without the probe's build: a cache blob made on a
    device of the same identity holds programs its compiler built, and records the float16
    answer (a warm start then builds nothing at all)."""
    with _probe_lock:
        _probes.setdefault(_device_key(device), DeviceProbe(True, splits_float16_calls=splits_float16_calls))


def float16_calls_split(device: cl.Device) -> bool:
    """Whether kernels must pass float16 to built-ins as float8 halves on this CPU device.

    PoCL 3.0's LLVM 14 does not know AMD's Zen 4: it compiles kernels for "znver3" (no AVX-512)
    and links the AVX-512 built-in library, and a float16 argument crashes the call. Clang warns
    wherever a float16 argument goes without AVX-512 ("... without 'avx512f' enabled changes the
    ABI"); the probe reads the warning from its build log. A CPU without AVX-512 at all answers
    True too, and loses nothing by it: its float16 calls travel as two halves either way.
    Blocking (the probe's build): call it from a worker thread.
    """
    return probe_device(device).splits_float16_calls


def probe_builds() -> int:
    """How many probes this process has built (a warm start from a cache blob builds none)."""
    return _probe_builds


_probe_builds = 0


def build_probe(device: cl.Device) -> DeviceProbe:
    global _probe_builds
    _probe_builds += 1
    # The probe's program goes with this function; its context, where the device works, goes to
    # the pool, so the first engine does not pay a fresh context's first build again.
    context = context_pool().open_context(device)
    program = cl.Program(context, _FLOAT16_CALL_PROBE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyopencl's CompilerWarning: the log is the answer
            program.build(devices=[device])
        log = program.get_build_info(device, cl.program_build_info.LOG) or ""
    except cl.Error as exc:
        return DeviceProbe(False, reason=unusable_reason(str(exc)))
    finally:
        del program
    context_pool().keep(device, context)
    return DeviceProbe(True, splits_float16_calls="changes the ABI" in log)


def unusable_reason(message: str) -> str:
    """The compiler's first error line in pyopencl's build message, and the fix."""
    # pyopencl's message: the status thrice, "Build on <device>:", the log, "(options: ...)".
    log = [line.strip() for line in message.splitlines() if line.strip()
           and not line.startswith(("clBuildProgram failed", "Build on ", "(options:"))]
    errors = [line for line in log if "error" in line.lower()]
    said = (errors or log or [message.strip() or "the build failed"])[0]
    why = ("this PoCL's LLVM does not know this CPU" if "unknown target CPU" in message
           else "its compiler cannot build a two-line kernel, so triodnn runs nothing on it")
    return (f"the compiler says {said!r}: {why}; another CPU runtime works: pip install "
            "'triodnn[cpu-intel]' (Intel's CPU runtime, from PyPI), or the distribution's PoCL "
            "(apt-get install pocl-opencl-icd)")

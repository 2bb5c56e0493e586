"""Discovery of the OpenCL devices an engine can run on."""

from __future__ import annotations

import warnings

import attrs
import pyopencl as cl

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


def list_devices() -> list[DeviceRecord]:
    """Every device of every platform, in platform order; an empty platform is skipped."""
    records: list[DeviceRecord] = []
    counts: dict[str, int] = {}
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return records
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        for device in devices:
            kind = device_kind(device)
            index = counts.get(kind, 0)
            counts[kind] = index + 1
            records.append(DeviceRecord(kind, index, device, platform))
    return records


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
    }


# A call with a float16 argument, which the probe below compiles (never runs). To a function of
# its own, not a built-in: PoCL 3.0 aborts the process when it releases the context of a program
# it loaded from its disk cache that calls a built-in across the mismatch.
_FLOAT16_CALL_PROBE = (
    "static float16 triodnn_twice(float16 x) { return x + x; }\n"
    "__kernel void triodnn_float16_call(__global float16* x) { x[0] = triodnn_twice(x[0]); }\n"
)
_float16_split: dict[tuple[str, ...], bool] = {}


def _device_key(device: cl.Device) -> tuple[str, ...]:
    return (device.platform.name, device.platform.version, device.name, device.driver_version)


def float16_calls_split(device: cl.Device) -> bool:
    """Whether kernels must pass float16 to built-ins as float8 halves on this CPU device.

    PoCL 3.0's LLVM 14 does not know AMD's Zen 4: it compiles kernels for "znver3" (no AVX-512)
    and links the AVX-512 built-in library, and a float16 argument crashes the call. Clang warns
    wherever a float16 argument goes without AVX-512 ("... without 'avx512f' enabled changes the
    ABI"); this builds a two-line probe (0.2-0.5 s; PoCL caches it with its log) and reads the
    warning. A CPU without AVX-512 at all answers True too, and loses nothing by it: its float16
    calls travel as two halves either way. Blocking: call it from a worker thread. Answered once
    per device per process.
    """
    key = _device_key(device)
    if key not in _float16_split:
        _float16_split[key] = "changes the ABI" in _probe_log(device)
    return _float16_split[key]


def _probe_log(device: cl.Device) -> str:
    # A context of its own: the engine's holds nothing of the probe.
    context = cl.Context([device])
    program = cl.Program(context, _FLOAT16_CALL_PROBE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyopencl's CompilerWarning: the log is the answer
            program.build(devices=[device])
        return program.get_build_info(device, cl.program_build_info.LOG) or ""
    except cl.Error:
        return ""  # a compiler that refuses the probe cannot have the mismatch it detects
    finally:
        del program, context

"""Discovery of the OpenCL devices an engine can run on."""

from __future__ import annotations

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
        "queue_properties": int(device.queue_properties),
        "single_fp_config": int(device.single_fp_config),
        "extensions": tuple(sorted(device.extensions.split())),
    }

"""Discovery that tells the truth: a CPU device whose compiler cannot build is left out, named, with
the fix; pip's drivers (Intel's CPU runtime) are registered with the ICD loader without hiding the
system's; the CPU runtimes count in the measured order, or ``$TRIODNN_CPU_RUNTIME``'s.

PyPI's PoCL cannot build on CPUs its LLVM 14 does not know (AMD's Zen 5: "unknown target CPU
'generic'"). The child processes here make it fail the same way on any CPU: PoCL appends
``$POCL_EXTRA_BUILD_FLAGS`` to every build, and refuses ``-target-cpu`` ("Invalid build option"),
so every build of that process fails at clBuildProgram, as on such a machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import triodnn
from triodnn.actors import _devices, _icd, cpu_runtime_rank, find_intel_cpu_runtime, probe_device

POCL = "Portable Computing Language"
INTEL = "Intel(R) OpenCL"
BROKEN_POCL = {"POCL_EXTRA_BUILD_FLAGS": "-target-cpu"}

# A child that reports what discovery found and what the default engine is, as JSON.
_REPORT = """
import json, warnings, trio, triodnn
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    usable = [(r.label, r.platform.name.strip()) for r in triodnn.available_engines()]
    unusable = [(u.platform.name.strip(), u.reason) for u in triodnn.unusable_devices()]
    triodnn.available_engines()  # a second pass probes nothing again, and warns nothing again

async def main():
    async with triodnn.open_runtime() as rt:
        try:
            engine = await rt.engine()
        except triodnn.EngineNotFoundError as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        platform = engine.info.platform
        prim = await engine.create_primitive(triodnn.EltwiseDesc("relu", triodnn.MemoryDesc((4,))))
        src = await engine.from_numpy([-1.0, 2.0, -3.0, 4.0])
        dst = engine.memory(triodnn.MemoryDesc((4,)))
        stream = await engine.stream()
        await stream.execute(prim, {"src": src, "dst": dst})
        return {"engine": str(engine).split(" (")[0], "platform": platform, "relu": (await dst.to_numpy()).tolist()}

result = trio.run(main)
result.update(usable=usable, unusable=unusable,
              warnings=[str(w.message) for w in caught if issubclass(w.category, triodnn.UnusableDeviceWarning)])
print(json.dumps(result))
"""


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIODNN_ENGINE", "TRIODNN_CPU_RUNTIME")}
    env.update(extra)
    return env


def report(**extra) -> dict:
    result = subprocess.run([sys.executable, "-c", _REPORT], capture_output=True, text=True, timeout=300,
                            env=child_env(**extra))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def pocl_registered() -> bool:
    return any(p == POCL for _, p in _platforms())


def _platforms() -> list[tuple[str, str]]:
    return [(device.name.strip(), platform.name.strip()) for device, platform in _devices.registered_devices()]


intel_installed = find_intel_cpu_runtime() is not None


@pytest.mark.skipif(not pocl_registered(), reason="PoCL is not registered here (pyopencl[pocl] brings it)")
def test_a_cpu_runtime_that_cannot_build_is_left_out_named_with_the_fix():
    found = report(**BROKEN_POCL)
    assert [platform for platform, _ in found["unusable"]] == [POCL]
    reason = found["unusable"][0][1]
    assert "Invalid build option: -target-cpu" in reason
    assert POCL not in [platform for _, platform in found["usable"]]
    # One warning per device per process, naming the device and the compiler's message.
    assert len(found["warnings"]) == 1
    assert POCL in found["warnings"][0] and "-target-cpu" in found["warnings"][0]
    if intel_installed:
        # The next working CPU runtime is cpu:0, and it computes.
        assert found["engine"] == "cpu:0" and found["platform"] == INTEL
        assert found["relu"] == [0.0, 2.0, 0.0, 4.0]
        assert ["cpu:0", INTEL] in found["usable"]
    else:
        # No CPU engine works: a typed error that says what to install, never another device.
        assert found["error"] == "EngineNotFoundError"
        assert "triodnn[cpu-intel]" in found["message"] and "pocl-opencl-icd" in found["message"]
        assert "-target-cpu" in found["message"]


@pytest.mark.skipif(not pocl_registered(), reason="PoCL is not registered here (pyopencl[pocl] brings it)")
def test_triodnn_info_lists_the_unusable_device_with_its_reason():
    result = subprocess.run([sys.executable, "-m", "triodnn", "info"], capture_output=True, text=True,
                            timeout=300, env=child_env(**BROKEN_POCL))
    lines = result.stdout.splitlines()
    unusable = [i for i, line in enumerate(lines) if line.startswith("unusable")]
    assert len(unusable) == 1, result.stdout
    assert POCL in lines[unusable[0]]
    assert "Invalid build option: -target-cpu" in lines[unusable[0] + 1]
    assert "UnusableDeviceWarning" not in result.stderr  # listed, not warned twice
    if intel_installed:
        assert result.returncode == 0
        assert any(line.startswith("cpu:0") for line in lines)
        assert lines[-1] == "default engine: cpu:0"
    else:
        assert not any(line.startswith("cpu:") for line in lines)


def test_the_zen5_failure_is_explained_with_the_cpu_runtimes_to_install():
    # pyopencl's message for the build PyPI's PoCL makes on an AMD Zen 5 (status, header, log).
    message = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE - clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\n"
               "Build on <pyopencl.Device 'pthread-AMD EPYC 9B45' on 'Portable Computing Language'>:\n\n"
               "error: unknown target CPU 'generic'\nnote: valid target CPU values are: nocona, core2\n\n"
               "(options: -I /x/pyopencl/cl)")
    reason = _devices.unusable_reason(message)
    assert reason.startswith("the compiler says \"error: unknown target CPU 'generic'\"")
    assert "pip install 'triodnn[cpu-intel]'" in reason and "apt-get install pocl-opencl-icd" in reason


@pytest.fixture
def builds(monkeypatch) -> list:
    """The names of the devices probes are built for from here on, the process's record emptied."""
    built: list = []
    real = _devices.build_probe
    monkeypatch.setattr(_devices, "_probes", {})
    monkeypatch.setattr(_devices, "build_probe", lambda device: built.append(device.name) or real(device))
    return built


@pytest.mark.cpu
def test_discovery_probes_each_cpu_device_once_per_process(builds):
    records = triodnn.available_engines()
    cpus = [r for r in records if r.kind == "cpu"]
    assert len(builds) == len(cpus) >= 1
    triodnn.available_engines()
    for record in cpus:
        assert probe_device(record.device).usable
    assert len(builds) == len(cpus)  # answered from the process's record


@pytest.mark.cpu
def test_finding_cpu0_probes_no_later_cpu_device(builds):
    first = _devices.list_devices("cpu", limit=1)
    assert [r.label for r in first] == ["cpu:0"]
    assert builds == [first[0].device.name]


@pytest.mark.cpu
async def test_an_engine_opened_with_its_cache_blob_needs_no_probe(rt, monkeypatch):
    engine = await rt.engine("cpu", 0)
    await engine.create_primitive(triodnn.EltwiseDesc("relu", triodnn.MemoryDesc((8,))))
    blob = engine.primitive_cache_blob()
    monkeypatch.setattr(_devices, "_probes", {})
    monkeypatch.setattr(_devices, "build_probe", lambda device: pytest.fail(f"probe built on {device.name}"))
    again = await rt.engine("cpu", 0, cache_blob=blob)
    assert again.cl_device == engine.cl_device


@pytest.mark.cpu
def test_cpu_runtime_env_puts_one_runtime_first(monkeypatch):
    monkeypatch.delenv("TRIODNN_CPU_RUNTIME", raising=False)
    assert cpu_runtime_rank(POCL) < cpu_runtime_rank(INTEL) < cpu_runtime_rank("Some Other CPU Runtime")
    monkeypatch.setenv("TRIODNN_CPU_RUNTIME", "intel")
    assert cpu_runtime_rank(INTEL) < cpu_runtime_rank(POCL)
    cpu_platforms = [platform.name.strip() for device, platform in _devices.registered_devices()
                     if _devices.device_kind(device) == "cpu"]
    if INTEL in cpu_platforms:
        assert cpu_platforms[0] == INTEL
    # Other kinds keep their places: only CPU devices trade places among themselves.
    kinds = [_devices.device_kind(device) for device, _ in _devices.registered_devices()]
    monkeypatch.setenv("TRIODNN_CPU_RUNTIME", "pocl")
    assert kinds == [_devices.device_kind(device) for device, _ in _devices.registered_devices()]


# -- pip's drivers and the ICD loader ----------------------------------------------------------


def test_the_vendors_folder_keeps_the_systems_drivers_and_adds_pips(tmp_path, monkeypatch):
    system = tmp_path / "vendors"
    system.mkdir()
    (system / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    (system / "intel-cpu.icd").write_text("/opt/anaconda1anaconda2anaconda3/lib/libintelocl.so\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    library = lib / _icd.INTEL_CPU_LIBRARY
    library.write_bytes(b"")
    monkeypatch.setattr(_icd, "library_folders", lambda: [lib])
    monkeypatch.setattr(_icd, "loadable", lambda path: None)
    monkeypatch.setattr(_icd, "_registered", None)
    monkeypatch.setattr(_icd, "vendors_base", lambda: tmp_path / "tmp")
    monkeypatch.setenv(_icd.VENDORS_ENV, str(system))
    monkeypatch.delenv(_icd.ORIGINAL_VENDORS_ENV, raising=False)
    monkeypatch.delenv(_icd.REGISTER_ENV, raising=False)
    assert _icd.register_pip_drivers() == [library]
    folder = Path(os.environ[_icd.VENDORS_ENV])
    icds = {f.name: f.read_text() for f in folder.glob("*.icd")}
    # NVIDIA's stays; the wheel's entry, naming a path that is not there, gives way to the real one.
    assert icds == {"nvidia.icd": "libnvidia-opencl.so.1\n", "triodnn-intel-cpu.icd": f"{library}\n"}
    assert os.environ[_icd.ORIGINAL_VENDORS_ENV] == str(system)
    # A child process inherits both variables and makes the same folder from the original.
    monkeypatch.setattr(_icd, "_registered", None)
    assert _icd.register_pip_drivers() == [library]
    assert Path(os.environ[_icd.VENDORS_ENV]) == folder


@pytest.mark.parametrize("source, expected", [
    ("", "system"),               # unset: the system's folder
    ("FOLDER", "folder"),         # a folder: its .icd files
    ("FILE", "file"),             # an .icd file: that one
    ("libOpenCL-vendor.so", "library"),  # anything else: a library the loader opens
])
def test_the_loaders_rules_for_its_variable(tmp_path, monkeypatch, source, expected):
    system = tmp_path / "system"
    system.mkdir()
    (system / "a.icd").write_text("liba.so\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "b.icd").write_text("libb.so\n")
    (folder / "notes.txt").write_text("not an icd\n")
    monkeypatch.setenv("OPENCL_VENDOR_PATH", str(system))
    value = {"FOLDER": str(folder), "FILE": str(folder / "b.icd")}.get(source, source)
    entries = _icd.source_icd_files(value)
    assert entries == {
        "system": [("a.icd", "liba.so\n")],
        "folder": [("b.icd", "libb.so\n")],
        "file": [("b.icd", "libb.so\n")],
        "library": [("library.icd", "libOpenCL-vendor.so\n")],
    }[expected]


def test_an_intel_runtime_that_does_not_load_is_not_registered_and_says_why(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / _icd.INTEL_CPU_LIBRARY).write_bytes(b"not a shared object")
    monkeypatch.setattr(_icd, "library_folders", lambda: [lib])
    monkeypatch.setattr(_icd, "_registered", None)
    monkeypatch.delenv(_icd.REGISTER_ENV, raising=False)
    before = os.environ.get(_icd.VENDORS_ENV)
    assert _icd.register_pip_drivers() == []
    assert os.environ.get(_icd.VENDORS_ENV) == before
    (problem,) = _icd.pip_driver_problems()
    assert "does not load" in problem and "intel-cmplr-lib-rt" in problem


@pytest.mark.skipif(not intel_installed, reason="Intel's CPU runtime is not installed (pip install 'triodnn[cpu-intel]')")
def test_the_installed_intel_runtime_is_registered_beside_the_others():
    platforms = {platform for _, platform in _platforms()}
    assert INTEL in platforms
    assert POCL in platforms or not pocl_registered()
    assert _icd.pip_driver_problems() == []


"""OpenCL drivers that pip installs but the ICD loader cannot find, registered with it.

Intel's CPU runtime for OpenCL comes from PyPI (``intel-opencl-rt``, with ``intel-cmplr-lib-rt``
and ``tbb``: ``pip install 'triodnn[cpu-intel]'``) into the environment's ``lib/`` folder, but
its wheel's ``etc/OpenCL/vendors/intel-cpu.icd`` names a build machine's path
(``/opt/anaconda1anaconda2anaconda3/lib/libintelocl.so``), so no loader finds it. It matters
on CPUs newer than PyPI's PoCL (LLVM 14) knows, such as AMD's Zen 5, where PoCL cannot build at
all and Intel's runtime is the CPU engine that works from pip alone.

The ICD loader pyopencl's wheel bundles (ocl-icd) reads its list of drivers once, at the first
OpenCL call of the process: the ``.icd`` files of ``$OCL_ICD_VENDORS`` (a folder, an ``.icd``
file or a library), else ``$OPENCL_VENDOR_PATH``, else ``/etc/OpenCL/vendors``, plus those in
pyopencl's own folder (PoCL's, Oclgrind's). ``register_pip_drivers`` therefore writes a folder
holding a copy of every ``.icd`` file the loader would have read (so the system's drivers, such as
NVIDIA's, stay registered) plus one that names the installed ``libintelocl.so`` by its full path,
and points ``$OCL_ICD_VENDORS`` at it before that first call. Child processes (pytest workers,
Dask workers) inherit the variable; the folder's marker records what it was made from, so a
child that finds it gone writes it again.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import site
import sys
import tempfile
from pathlib import Path

VENDORS_ENV = "OCL_ICD_VENDORS"
# What $OCL_ICD_VENDORS was before triodnn replaced it ("" for unset): the folder it writes is
# made from that, in this process and in its children.
ORIGINAL_VENDORS_ENV = "TRIODNN_ORIGINAL_OCL_ICD_VENDORS"
# "0" leaves the loader's list as it is (a machine that wants only its registered drivers).
REGISTER_ENV = "TRIODNN_REGISTER_PIP_DRIVERS"
_MARKER = "triodnn-vendors.txt"
_SYSTEM_VENDORS = "/etc/OpenCL/vendors"
INTEL_CPU_LIBRARY = "libintelocl.so"


def library_folders() -> list[Path]:
    """Where pip puts a wheel's ``lib/`` data files: this environment, its base, the user's."""
    prefixes = [sys.prefix, sys.base_prefix, site.getuserbase()]
    folders: list[Path] = []
    for prefix in prefixes:
        folder = Path(prefix) / "lib"
        if folder not in folders:
            folders.append(folder)
    return folders


def find_intel_cpu_runtime() -> Path | None:
    """The installed ``libintelocl.so`` (Intel's CPU runtime from PyPI), or None."""
    for folder in library_folders():
        candidate = folder / INTEL_CPU_LIBRARY
        if candidate.is_file():
            return candidate
    return None


def loadable(library: Path) -> str | None:
    """None when ``library`` and its dependencies load, else the loader's message. Intel's
    libraries find each other through their RUNPATH ($ORIGIN) when pip put them in one folder;
    this catches an install that split them (a missing ``intel-cmplr-lib-rt``) before the ICD
    loader would skip the driver without a word."""
    try:
        ctypes.CDLL(str(library), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as exc:
        return str(exc)
    return None


def source_icd_files(source: str) -> list[tuple[str, str]]:
    """(name, content) of the ``.icd`` files the loader would read for ``source``, the value
    $OCL_ICD_VENDORS had (ocl-icd's rules: a folder, an ``.icd`` file, else a library)."""
    if source:
        path = Path(source)
        if path.is_dir():
            folder = path
        elif source.endswith(".icd"):
            return [(path.name, path.read_text())] if path.is_file() else []
        else:
            return [("library.icd", source + "\n")]
    else:
        folder = Path(os.environ.get("OPENCL_VENDOR_PATH") or _SYSTEM_VENDORS)
    try:
        files = sorted(folder.glob("*.icd"))
    except OSError:
        return []
    found = []
    for file in files:
        try:
            found.append((file.name, file.read_text()))
        except OSError:
            continue  # an unreadable entry: the loader would skip it too
    return found


def vendors_base() -> Path:
    """Where the vendors folders go: the temporary folder, one per user (ICD files name
    libraries the loader opens, so no other user may write them)."""
    return Path(tempfile.gettempdir()) / f"triodnn-ocl-vendors-{os.getuid()}"


def _write_vendors(entries: list[tuple[str, str]]) -> Path:
    """A folder holding ``entries``, named by their hash (the same content reuses one folder)."""
    digest = hashlib.sha256(repr(entries).encode()).hexdigest()[:16]
    base = vendors_base()
    folder = base / digest
    if (folder / _MARKER).is_file():
        return folder
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_mkdir(base)))
    for name, content in entries:
        (staging / name).write_text(content)
    (staging / _MARKER).write_text("written by triodnn: its .icd files are the system's plus pip's drivers\n")
    try:
        staging.rename(folder)
    except OSError:
        # Another process wrote the same folder first: its content is the same.
        for file in staging.iterdir():
            file.unlink()
        staging.rmdir()
    return folder


def _mkdir(folder: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid != os.getuid():  # made by another user in a shared /tmp: not ours to trust
        raise PermissionError(f"{folder} belongs to another user")
    return folder


_registered: list[Path] | None = None


def register_pip_drivers() -> list[Path]:
    """Register the OpenCL drivers pip installed that the loader cannot find (Intel's CPU
    runtime) by pointing ``$OCL_ICD_VENDORS`` at a folder of the loader's own list plus theirs.

    Call before the process's first OpenCL call (``import triodnn`` does): the loader reads
    its list once. Returns the libraries registered ([] where none is installed, where one does
    not load, or where ``$TRIODNN_REGISTER_PIP_DRIVERS=0``). Once per process.
    """
    global _registered
    if _registered is not None:
        return _registered
    _registered = []
    if os.environ.get(REGISTER_ENV) == "0":
        return _registered
    library = find_intel_cpu_runtime()
    if library is None or loadable(library) is not None:
        # Not installed, or installed without what it needs: discovery has no Intel platform,
        # and `triodnn info` says why (``pip_driver_problems``).
        return _registered
    if ORIGINAL_VENDORS_ENV in os.environ:
        source = os.environ[ORIGINAL_VENDORS_ENV]  # a parent process registered already
    else:
        source = os.environ.get(VENDORS_ENV, "")
    entries = [(name, content) for name, content in source_icd_files(source)
               if INTEL_CPU_LIBRARY not in content]  # the wheel's own entry names a path that is not there
    entries.append(("triodnn-intel-cpu.icd", f"{library}\n"))
    try:
        folder = _write_vendors(entries)
    except OSError:
        return _registered  # no writable temporary folder: the loader's own list stands
    os.environ[ORIGINAL_VENDORS_ENV] = source
    os.environ[VENDORS_ENV] = str(folder)
    _registered = [library]
    return _registered


def pip_driver_problems() -> list[str]:
    """Why an installed pip driver is not registered, one line each (for ``triodnn info``)."""
    library = find_intel_cpu_runtime()
    if library is None:
        return []
    if os.environ.get(REGISTER_ENV) == "0":
        return [f"Intel's CPU runtime ({library}) is installed but not registered: ${REGISTER_ENV}=0"]
    problem = loadable(library)
    if problem is not None:
        return [f"Intel's CPU runtime ({library}) does not load: {problem}; "
                "pip install intel-cmplr-lib-rt tbb into the same environment"]
    return []

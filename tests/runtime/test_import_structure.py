"""The import structure triodnn holds to: no import cycle is live when triodnn loads, and no
import hides inside a function (the old way of breaking cycles).

``lint-imports`` (.ci/run) checks the layer contract and cycles statically; this checks what
actually happens at run time: a module imported while it is still executing its own body (a
partially initialised module reached through a cycle) is reported with its importer. A package
being initialised while its own submodules import is not a cycle: that is how packages load.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "values", ROOT / "kernels", ROOT / "actors", ROOT / "runtime", ROOT / "graph"]

# The modules of triodnn that need an optional dependency, and the package each imports for it:
# triodnn.dask needs dask's distributed scheduler (triodnn[dask]). Where that package is not
# installed the probe leaves the module out (and says so); anywhere else the module must import.
OPTIONAL = {"triodnn.dask": "distributed"}
# Packages the probe hides with --hide-optional, as an installation without triodnn[dask] lacks them.
HIDDEN = ("dask", "distributed")

_PROBE = r"""
import builtins, importlib, json, pkgutil, sys

OPTIONAL, HIDDEN = json.loads(sys.argv[1]), tuple(json.loads(sys.argv[2]))
if sys.argv[3] == "--hide-optional":
    class _Uninstalled:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Uninstalled())


def installed(package):
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as error:
        return error.name != package  # another module missing: installed but broken, imported below
    return True


cycles = []
_import = builtins.__import__


def _absolute(name, globals, level):
    if level == 0:
        return name
    package = (globals or {}).get("__package__") or ""
    base = package.rsplit(".", level - 1)[0] if level > 1 else package
    return f"{base}.{name}" if name else base


def _initialising(module_name):
    module = sys.modules.get(module_name)
    spec = getattr(module, "__spec__", None)
    return module is not None and getattr(spec, "_initializing", False)


def hook(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "")
    target = _absolute(name, globals, level)
    if importer.startswith("triodnn") and target.startswith("triodnn"):
        names = [target] + [f"{target}.{item}" for item in (fromlist or ()) if item != "*"]
        for module_name in names:
            ancestor = importer == module_name or importer.startswith(module_name + ".")
            if not ancestor and _initialising(module_name):
                cycles.append([importer, module_name])
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = hook
import triodnn
modules, left_out = ["triodnn"], []
# Each folder mapped to a package of its own is walked from its package: an editable install's
# triodnn.__path__ holds runtime/ alone.
for root in ("triodnn", "triodnn._values", "triodnn.kernels", "triodnn.actors", "triodnn.graph"):
    package = importlib.import_module(root)
    for info in pkgutil.walk_packages(package.__path__, root + "."):
        if info.name.endswith("__main__") or info.name in modules or info.name in left_out:
            continue
        if info.name in OPTIONAL and not installed(OPTIONAL[info.name]):
            left_out.append(info.name)
            continue
        importlib.import_module(info.name)
        modules.append(info.name)
print(json.dumps({"cycles": cycles, "modules": modules, "left_out": left_out}))
"""


def probe(*flags: str) -> dict:
    """Run the probe in a fresh interpreter; its modules imported, those left out, the cycles."""
    args = [sys.executable, "-c", _PROBE, json.dumps(OPTIONAL), json.dumps(HIDDEN), *(flags or ("--",))]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _installed(package: str) -> bool:
    """As the probe decides: ``package`` imports, or fails for another module (installed but
    broken: the probe's import of the module needing it then fails the test)."""
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as error:
        return error.name != package
    return True


def test_import_triodnn_enters_no_cycle():
    """Every module of triodnn imported in a fresh interpreter (triodnn.dask only where dask's
    distributed is installed); none reached half-initialised."""
    result = probe()
    assert len(result["modules"]) > 40, result["modules"]  # the walk really covered the package
    assert result["left_out"] == [name for name, package in OPTIONAL.items() if not _installed(package)]
    assert result["cycles"] == [], "imports through a cycle (importer, half-initialised module): " + ", ".join(
        f"{a} -> {b}" for a, b in result["cycles"]
    )


def test_without_dask_only_triodnn_dask_is_left_out():
    """As where triodnn[dask] is not installed (dask and distributed hidden): the probe leaves
    out triodnn.dask and nothing else, and every other module imports without them."""
    result = probe("--hide-optional")
    assert result["left_out"] == ["triodnn.dask"]
    assert len(result["modules"]) > 40 and "triodnn.dask" not in result["modules"]
    assert result["cycles"] == []


def _function_local_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    found.append(f"{path.relative_to(ROOT)}:{inner.lineno}: {ast.unparse(inner)}")
    return found


def test_no_function_local_imports():
    """Imports sit at module top, where the layer check sees them; none defers a cycle."""
    found = [line for source in SOURCES for path in sorted(source.rglob("*.py"))
             for line in _function_local_imports(path)]
    assert found == [], "function-local imports:\n" + "\n".join(found)

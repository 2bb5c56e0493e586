"""The import structure issue 15 asks for: no import cycle is live when triodnn loads, and no
import hides inside a function (the old way of breaking cycles).

``lint-imports`` (.ci/run) checks the layer contract and cycles statically; this checks what
actually happens at run time: a module imported while it is still executing its own body (a
partially initialised module reached through a cycle) is reported with its importer. A package
being initialised while its own submodules import is not a cycle: that is how packages load.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "runtime", ROOT / "actors", ROOT / "kernels"]

_PROBE = r"""
import builtins, importlib, json, pkgutil, sys

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
modules = ["triodnn"]
for info in pkgutil.walk_packages(triodnn.__path__, "triodnn."):
    if info.name.endswith("__main__"):
        continue
    importlib.import_module(info.name)
    modules.append(info.name)
print(json.dumps({"cycles": cycles, "modules": modules}))
"""


def test_import_triodnn_enters_no_cycle():
    """Every module of triodnn imported in a fresh interpreter; none reached half-initialised."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["modules"]) > 40, result["modules"]  # the walk really covered the package
    assert result["cycles"] == [], "imports through a cycle (importer, half-initialised module): " + ", ".join(
        f"{a} -> {b}" for a, b in result["cycles"]
    )


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

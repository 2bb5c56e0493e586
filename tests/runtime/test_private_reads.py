"""No object reads another's private attributes: it asks through a named accessor.

Every ``<expr>._name`` (one leading underscore, not a dunder) in the package's source is a read
(or write) of a private attribute. It is the object's own when ``<expr>`` is ``self``, ``cls`` or
``super()``, and a module's when ``<expr>`` is a name the module imported (``cl._cl``,
``_constant_cache.release``). Any other is one object reaching into another, and fails here
with its place and expression, unless ``ALLOWED`` names it with its reason: a class reading
another instance of itself, which is the one legitimate case.

Scans ``runtime/``, ``actors/`` and ``kernels/`` as ``test_import_structure`` does: tests,
benchmarks and examples may read privates.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "values", ROOT / "kernels", ROOT / "actors", ROOT / "runtime", ROOT / "graph"]

# (file, enclosing function's qualified name, expression) -> why it is no cross-object read.
ALLOWED = {
    ("runtime/_blocking.py", "Blocking.__eq__", "other._target"):
        "two wrappers compare their targets: Blocking reading another Blocking",
    ("runtime/_engine.py", "Engine.create_reorder", "src_engine._create"):
        "a reorder within one context is created on the source engine: Engine asking another Engine",
    ("runtime/_engine.py", "Engine.create_reorder", "executing._create"):
        "a cross-engine reorder is created on the engine that executes it: Engine asking another Engine",
    ("runtime/_engine.py", "Engine.create_reorder", "peer._open_transfer_stream"):
        "the engine that does not execute copies through its transfer stream: Engine asking another Engine",
    ("runtime/_memory.py", "Memory.released", "self._viewed._buffer"):
        "a view is released with the memory it looks into: Memory reading another Memory",
}


def _imported_names(tree: ast.Module) -> set[str]:
    """Names a module binds by importing: modules (their first component) and imported names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _own(value: ast.expr, imported: set[str]) -> bool:
    """Whether ``value`` is the object itself (self, cls, super()) or an imported module or name."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls") or value.id in imported
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


class _Finder(ast.NodeVisitor):
    """Collects (line, enclosing qualified name, expression) of each cross-object private access."""

    def __init__(self, imported: set[str]) -> None:
        self.imported = imported
        self.scope: list[str] = []
        self.found: list[tuple[int, str, str]] = []

    def _enter(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _enter

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        if name.startswith("_") and not name.startswith("__") and not _own(node.value, self.imported):
            self.found.append((node.lineno, ".".join(self.scope) or "<module>", ast.unparse(node)))
        self.generic_visit(node)


def private_reads() -> list[tuple[str, int, str, str]]:
    """(file, line, enclosing qualified name, expression) of every cross-object private access."""
    found = []
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            finder = _Finder(_imported_names(tree))
            finder.visit(tree)
            relative = path.relative_to(ROOT).as_posix()
            found += [(relative, line, scope, expression) for line, scope, expression in finder.found]
    return found


def test_no_object_reads_another_objects_private_attributes():
    """Each cross-object ``._name`` is a named accessor missing on the owner: add one there."""
    reads = [(path, line, scope, expression) for path, line, scope, expression in private_reads()
             if (path, scope, expression) not in ALLOWED]
    assert reads == [], "private attributes of another object (give the owner an accessor):\n" + "\n".join(
        f"{path}:{line}: {expression} (in {scope})" for path, line, scope, expression in reads
    )


def test_every_allowed_read_is_still_there():
    """No stale entry: an allowance whose read is gone would let a new one in unseen."""
    present = {(path, scope, expression) for path, _, scope, expression in private_reads()}
    stale = sorted(set(ALLOWED) - present)
    assert stale == [], "ALLOWED names reads that no longer exist: " + ", ".join(map(str, stale))


def test_the_scan_sees_reads():
    """The scan itself: a cross-object read is found, the object's own and a module's are not."""
    tree = ast.parse(
        "import pyopencl as cl\nfrom . import _cache\n"
        "class A:\n"
        "    def f(self, other):\n"
        "        return self._x, cls._y, super()._z, cl._cl, _cache._entries, other._w, other.__dict__\n"
    )
    finder = _Finder(_imported_names(tree))
    finder.visit(tree)
    assert finder.found == [(5, "A.f", "other._w")]

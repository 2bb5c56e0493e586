"""The test data kept beside the repository (``shared/``: oneDNN's serialized graphs, benchdnn's
inputs and harness files): where it is, and what a test that needs it does where it is absent.

``TRIODNN_SHARED`` names the folder; by default it is ``shared`` beside the checkout (``../shared``
from the repository root). A test that needs a file of it calls ``require`` first: where the file
is absent it fails under CI (``CI`` set, as CI services and .ci/run set it), since a CI run
without the data would pass with those tests skipped, along with the bugs only they catch; elsewhere
(a checkout without the data) it skips, the reason naming the missing path.

Test modules import it as ``from _shared import ...``: tests/ has no ``__init__.py``, so pytest
(rootdir-based, "prepend" import mode) puts tests/ on ``sys.path`` when it loads tests/conftest.py,
before any test module, in each xdist worker too. The name starts with ``_``: pytest never
collects it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
DEFAULT = REPOSITORY.parent / "shared"
SHARED = Path(os.environ["TRIODNN_SHARED"]) if os.environ.get("TRIODNN_SHARED") else DEFAULT
# public/: oneDNN's serialized graphs (see its SOURCES.txt); benchdnn/: benchdnn's graph inputs and
# harness files, as benchdnn's own tree names them.
GRAPHS = SHARED / "graphs"


def in_ci() -> bool:
    """Whether this run is CI's: ``CI`` set to anything but empty, 0, false or no."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def present(path: Path) -> bool:
    """A file that exists, or a folder holding something."""
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def require(path: Path) -> None:
    """Fail (under CI) or skip (elsewhere) the calling test, or the fixture's tests, unless
    ``path`` (a file or a non-empty folder of the shared data) is present."""
    __tracebackhide__ = True  # the skip and the failure are reported at the caller's line
    if present(path):
        return
    where = ("TRIODNN_SHARED names the folder" if os.environ.get("TRIODNN_SHARED")
             else "TRIODNN_SHARED unset: the folder beside the repository")
    message = f"shared test data absent: {path} ({where})"
    if in_ci():
        pytest.fail(f"{message}; CI runs need it (CI={os.environ['CI']!r})", pytrace=False)
    pytest.skip(message)

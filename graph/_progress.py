"""Progress of long graph work (a cold ``compile_graph`` builds kernels for seconds): what
``compile_graph(..., progress=)`` reports to.

``progress`` is False or None (nothing shown), a callable ``(done, total, what)`` called as each
step finishes (``done`` of ``total``, ``what`` the step just done), or True: a tqdm bar
(``tqdm.auto``: a widget in a notebook) where tqdm is installed, else a line on stderr redrawn in
place when stderr is a terminal, else nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .._values._errors import InvalidArgumentError

try:
    from tqdm.auto import tqdm as _tqdm
except ImportError:  # optional: the line on stderr stands in for it
    _tqdm = None

ProgressCallback = Callable[[int, int, str], None]


class _TqdmBar:
    """A tqdm bar made at the first report (the total is known then), closed at the last."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.bar: Any = None

    def __call__(self, done: int, total: int, what: str) -> None:
        assert _tqdm is not None, "made only where tqdm imports"
        if self.bar is None:
            self.bar = _tqdm(total=total, desc=self.description, leave=False)
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(what[:40], refresh=True)
        if done >= total:
            self.bar.close()


class _Line:
    """``description: done/total what`` on one stderr line, redrawn in place and cleared at the
    end; silent where stderr is no terminal (logs, CI, a notebook's output)."""

    def __init__(self, description: str, stream=None) -> None:
        self.description = description
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.live:
            return
        line = f"{self.description}: {done}/{total} {what}"[:79]
        self.stream.write("\r" + line.ljust(79) + ("\r" + " " * 79 + "\r" if done >= total else ""))
        self.stream.flush()


def progress_bar(description: str) -> ProgressCallback:
    """A ``(done, total, what)`` callable showing progress as ``progress=True`` does: a tqdm
    bar (a widget in a notebook) where tqdm is installed, else a line on a terminal's stderr.
    For loops of one's own (a notebook's compile of each partition, a cache filled key by key)."""
    return _TqdmBar(description) if _tqdm is not None else _Line(description)


def progress_callback(progress, description: str) -> ProgressCallback | None:
    """The callable ``progress`` stands for (see the module docstring); None for no reports."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return progress_bar(description)
    if callable(progress):
        return progress
    raise InvalidArgumentError(
        f"progress is {type(progress).__name__}; expected True, False, None or a callable (done, total, what)"
    )

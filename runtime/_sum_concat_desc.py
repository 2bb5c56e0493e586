"""Moved (issue 15) to ``triodnn._values._sum_desc`` and ``_concat_desc``. Re-exports for the
importers not yet updated."""

from ._values._concat_desc import ConcatDesc as ConcatDesc
from ._values._sum_desc import SumDesc as SumDesc

"""Moved (issue 15): the descriptors to ``triodnn._values._reorder_desc``, the cross-engine
primitive to ``triodnn._cross_engine_reorder``. Re-exports for the importers not yet updated."""

from ._values._reorder_desc import CrossEngineReorderDesc as CrossEngineReorderDesc
from ._values._reorder_desc import ReorderDesc as ReorderDesc

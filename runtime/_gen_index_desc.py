"""Moved to ``triodnn._values._gen_index_desc`` (issue 15); this re-export goes in the final sweep."""

from ._values._gen_index_desc import GenIndexDesc as GenIndexDesc

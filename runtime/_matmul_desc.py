"""Moved to ``triodnn._values._matmul_desc`` (issue 15); this re-export goes in the final sweep."""

from ._values._matmul_desc import MatmulDesc as MatmulDesc

"""Moved (issue 15) to ``triodnn._values._sdpa_desc``. Re-exports for the importers not yet
updated."""

from ._values._sdpa_desc import SdpaDesc as SdpaDesc

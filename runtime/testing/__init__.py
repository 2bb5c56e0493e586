"""triodnn.testing: checking triodnn against numpy, outside the production code.

    from triodnn.testing import make_inputs, reference, run_case, tolerance

- ``run_case``: one graph checked as benchdnn's graph driver does (fill the inputs, run every
  partition, compare each output with the op-by-op numpy reference); ``make_inputs`` and
  ``run_graph`` are its steps.
- ``parse_harness`` / ``run_benchdnn_runs``: what ``triodnn graph`` runs: benchdnn's harness files (``--batch=FILE``) and
  options (``--reset``, ``--in-shapes``, ``--op-attrs``, ``--op-kind``, ``--mb``, ``--dt``,
  ``--tensor-property``, ``--attr-fpmath``, comma alternatives) as ``Run`` records, run with
  benchdnn's states (PASSED, SKIPPED, UNIMPLEMENTED, INVALID_ARGUMENTS, FAILED);
  ``rewrite_graph`` applies one run's options to a graph document.
- ``fill_input``, ``tolerance``, ``narrowest_dtype``: benchdnn graph's input filling and the
  comparison tolerances of partitions.
- ``reference``, ``to_dtype_values``: numpy references of oneDNN Graph ops, one op at a time.
- ``run_demo``: ``triodnn demo``, a diamond of primitives checked against numpy.

Nothing in ``triodnn`` or ``triodnn.graph`` imports this package; the command line does.
"""

from ._benchdnn import Run
from ._benchdnn import parse_file as parse_harness
from ._benchdnn import rewrite as rewrite_graph
from ._demo import run_demo
from ._driver import CaseResult, OutputCheck, make_inputs, run_benchdnn, run_benchdnn_runs, run_case, run_graph
from ._filling import ROLES, fill_input, narrowest_dtype, tolerance
from ._reference import FLOAT_DTYPES, reference, to_dtype_values

__all__ = [
    "CaseResult",
    "FLOAT_DTYPES",
    "OutputCheck",
    "ROLES",
    "Run",
    "fill_input",
    "make_inputs",
    "narrowest_dtype",
    "parse_harness",
    "reference",
    "rewrite_graph",
    "run_benchdnn",
    "run_benchdnn_runs",
    "run_case",
    "run_demo",
    "run_graph",
    "to_dtype_values",
    "tolerance",
]

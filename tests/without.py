"""Run ``python -m django`` as if some modules were not installed.

    python -m tests.without prometheus_client,MySQLdb queue metrics

sets each named module to ``None`` in ``sys.modules`` (so importing it raises
``ImportError``, as when it is missing), then runs ``django`` with the rest of the arguments:
what a project without an optional extra sees.
"""

import runpy
import sys

names, *arguments = sys.argv[1:]
for name in names.split(","):
    sys.modules[name] = None
sys.argv = ["django", *arguments]
runpy.run_module("django", run_name="__main__", alter_sys=True)

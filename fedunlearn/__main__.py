"""``python -m fedunlearn``: the command line (the ``cli`` package, one layer above the core)."""

import runpy

runpy.run_module("cli", run_name="__main__", alter_sys=True)

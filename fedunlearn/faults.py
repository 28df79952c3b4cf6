"""Failpoints: named places in the deletion batch where the reliability harness
(``tests/reliability/test_fault_injection.py``, issue #10) kills the process, to prove that a
batch killed at any of them is finished exactly once by the next run.

Inert in production: ``failpoint(name)`` does nothing unless the environment variable
``FEDUNLEARN_FAILPOINT`` equals ``name``; then it sends SIGKILL to its own process — no
exception, no ``finally``, no atexit: the same as a power cut or the OOM killer, as far as the
workspace's files, the ledger and the MLflow registry can tell.

On the Flower runner a node can fail too: ``FEDUNLEARN_FLOWER_FAULT=kill-supernode:<i>`` makes the
local deployment kill SuperNode i mid-round (``fedunlearn_flower.deployment``, the same idea there).
"""

from __future__ import annotations

import os
import signal

FAILPOINT_VARIABLE = "FEDUNLEARN_FAILPOINT"

# The stages of one batch of ``fedunlearn process``, in the order a batch reaches them.
FAILPOINTS = [
    "after-ingest",         # inbox collected and validated, batch journaled; the ledger not yet appended
    "after-ledger-append",  # ledger entries durable; the journal not yet advanced, no new data version yet
    "during-unlearning",    # the method has run; its weights exist only in memory, nothing certified or stored
    "after-registration",   # unlearned version registered; gates not applied, alias 'current' not moved
    "after-alias-move",     # gates applied, 'current' moved to the unlearned version if it passed; no receipt
    "after-receipt",        # receipt written; receipts it repays not marked, log not signed, debt not settled
    "after-tree-head",      # receipts marked, log signed and published; debt not settled, batch not finished
]
# Not a stage every batch reaches (only one whose exact forgetting retires a version), so apart from the list
# the harness walks: a retired version's weights deleted, its tombstone not yet tagged ``retired``.
RETIREMENT_FAILPOINT = "during-retirement"


def failpoint(name: str) -> None:
    """SIGKILL this process if ``FEDUNLEARN_FAILPOINT`` names this failpoint, else do nothing."""
    if os.environ.get(FAILPOINT_VARIABLE) == name:
        os.kill(os.getpid(), signal.SIGKILL)

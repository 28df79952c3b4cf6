"""The Merkle log's tree head published with a batch, as a Prefect task run (issue 39, item 4).

Where it belongs (not wired here: the flows are being restructured, issue 36): right after the
batch's receipt is written — ``tasks.receipts.write_receipt`` (called by flows/promote.py and
flows/unlearn.py), before flows/promote.py's ``sync_state(..., "receipt")`` so that the state
snapshot pushed to the DVC remote carries the new head — and after ``tasks.debt`` writes a receipt
with ``exactly_forgotten`` (the exact-forgetting statement). One line each::

    publish_tree_head_task(ws.root, receipt.models["unlearned"].run_id if receipt.models.get("unlearned") else None)
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from stores.transparency import publish_tree_head


@task(name="publish-tree-head", cache_policy=NO_CACHE)
def publish_tree_head_task(root: Path, run_id: str | None = None) -> int:
    """Log what the ledger and receipts hold that the Merkle log lacks, sign, and publish the head
    to the DVC remote and MLflow; returns the signed tree size."""
    published = publish_tree_head(Path(root), run_id)
    for line in published.lines():
        get_run_logger().info(line)
    return published.size

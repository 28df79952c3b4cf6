"""The Merkle log's tree head published with a batch, as a Prefect task run.

``flows.promote.promote_and_receipt`` runs it right after the batch's receipt is written and before
the state snapshot is pushed, so the snapshot on the DVC remote carries the head that logs the batch;
``tasks.debt`` publishes (``stores.transparency.publish_tree_head``) after it marks receipts exactly
forgotten, so the exact-forgetting statements are logged under a newly signed head.
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from stores.transparency import publish_tree_head, refuse_if_damaged


@task(name="publish-tree-head", cache_policy=NO_CACHE)
def publish_tree_head_task(root: Path, run_id: str | None = None) -> int:
    """Log what the ledger and receipts hold that the Merkle log lacks, sign, and publish the head
    to the DVC remote and MLflow; returns the signed tree size."""
    published = publish_tree_head(Path(root), run_id)
    for line in published.lines():
        get_run_logger().info(line)
    return published.size


@task(name="verify-before-writing", cache_policy=NO_CACHE)
def verify_before_writing(root: Path, command: str, ledger_checked: bool = False) -> None:
    """Verify, then write: the ledger, the Merkle log (its heads, published ones, every leaf against
    its record) and the receipts checked before a command tags, logs or signs anything; damage
    stops it (``LogRewritten``, exit status 4) with nothing written."""
    refuse_if_damaged(Path(root), command, ledger_checked)

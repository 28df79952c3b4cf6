"""The pipeline on the Flower engine (issue 38 item 3), as a new user runs it: `fedunlearn train
--scenario digits-hfl --runner flower`, a sample request, `fedunlearn process --runner flower`.
It starts local Flower deployments (a SuperLink and three SuperNodes, twice or three times), which
costs a minute or more: ``make reliability`` only.

Checked: the original and the serving interim version carry the ``runtime`` tag of the engine that
computed them; a Flower fault during the batch (``NodeLost``) ends the command with its message and
registers nothing for the attempt, and the next run completes the batch once; no Flower process is
left after either command.
"""

from __future__ import annotations

import os

import psutil
import pytest
from mlflow import MlflowClient

import tasks.unlearning as unlearning_tasks
from cli.data import sample_ids
from fedunlearn.receipts import read_receipts
from fedunlearn_flower.errors import NodeLost
from stores.registry import tracking_uri
from workspaces import call_cli

SCENARIO = "digits-hfl"
FULL = os.environ.get("RELIABILITY_FULL") == "1"

pytestmark = pytest.mark.skipif(not FULL, reason="starts Flower deployments: make reliability")


def registry(workspace) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))


def versions(workspace) -> list:
    return registry(workspace).search_model_versions(f"name='{SCENARIO}'")


def flower_processes() -> list[str]:
    """This process's descendants that are Flower's (SuperLink, SuperNodes, ClientApps, ServerApp)."""
    return [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
            if any(name in " ".join(p.cmdline()) for name in ("flower-", "flwr-"))]


def lose_a_node(*args, **kwargs):
    raise NodeLost("SuperNode 2 exited mid-run: client 2 is gone (injected by the test)")


def test_train_request_process_through_flower_and_a_lost_node_resumes_once(workspace, prefect_server,
                                                                            monkeypatch):
    trained = call_cli(workspace, "train", "--scenario", SCENARIO, "--runner", "flower")
    assert trained.status == 0, trained.err
    [original] = versions(workspace)
    assert original.tags["runtime"] == "flower-deployment" and original.tags["role"] == "original"
    assert flower_processes() == []

    ids = sample_ids(workspace, SCENARIO, 1)[:10]
    assert call_cli(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids).status == 0
    with monkeypatch.context() as patch:
        patch.setattr(unlearning_tasks, "unlearn_with_flower", lose_a_node)
        failed = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower")
    assert failed.status == 1 and "SuperNode 2 exited mid-run" in failed.err
    assert [v.tags["role"] for v in versions(workspace)] == ["original"]  # nothing registered for the attempt
    assert read_receipts(workspace, SCENARIO) == []

    done = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower")
    assert done.status == 0, done.err
    [receipt] = read_receipts(workspace, SCENARIO)
    current = registry(workspace).get_model_version_by_alias(SCENARIO, "current")
    assert current.tags["runtime"].startswith("flower") and current.tags["role"] == "unlearned"
    assert current.tags["batch_id"] == receipt.batch_id and receipt.promoted
    assert str(receipt.models["unlearned"].version) == str(current.version)
    assert flower_processes() == []
    again = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower")
    assert again.status == 0 and len(read_receipts(workspace, SCENARIO)) == 1

"""A federation in shards through the pipeline, as a user runs it (issue 48), in ``make reliability``
only (about 5 minutes of separate `fedunlearn` processes): train a sharded digits scenario, forget a
client's request on the interim tier, then repay the debt with the run SIGKILLed right after the
touched shard's retrain was checkpointed (failpoint ``after-shard-trained``, before the aggregate is
registered). The next run resumes from the checkpoint: it trains nothing, registers the aggregate,
names the retrained shard on the receipt, and the registered model loads and predicts through MLflow
like any other."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from batch_harness import Cli
from conftest import FULL
from workspaces import add_sharded_digits, init_workspace_at

SCENARIO = "digits-shards-hfl"


@pytest.mark.skipif(not FULL, reason="end to end through separate processes: make reliability")
def test_an_exact_retrain_killed_between_a_shard_and_the_aggregate_resumes(tmp_path: Path):
    from mlflow import MlflowClient
    import mlflow
    import mlflow.pytorch

    from fedunlearn.receipts import read_receipts
    from fedunlearn.sharded_federation import ShardedFederation
    from stores.registry import tracking_uri
    from stores.workspace import Workspace
    from tasks.shards import SHARD_TRAINED, checkpoint_dir
    from tasks.data import read_federation

    root = init_workspace_at(tmp_path / "ws")
    add_sharded_digits(root, SCENARIO, rounds=2)
    cli = Cli(root, "", tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    assert cli.run("train", "--scenario", SCENARIO, "--inline", own_server=True).returncode == 0
    federation = read_federation(Workspace.open(root), SCENARIO, torch.device("cpu"))
    assert isinstance(federation, ShardedFederation)
    client = federation.members(1)[0]
    assert cli.run("request", "client", "--client", str(client), "--scenario", SCENARIO,
                   own_server=True).returncode == 0
    assert cli.run("process", "--scenario", SCENARIO, own_server=True).returncode == 0

    killed = cli.run("repay-debt", "--scenario", SCENARIO, failpoint=SHARD_TRAINED, own_server=True)
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    ws = Workspace.open(root)
    assert len(list(checkpoint_dir(ws, SCENARIO).glob("*.pt"))) == 1
    resumed = cli.run("repay-debt", "--scenario", SCENARIO, own_server=True)
    assert resumed.returncode == 0, resumed.describe()
    assert not list(checkpoint_dir(ws, SCENARIO).glob("*.pt"))  # cleared once the aggregate is registered

    client_api = MlflowClient(tracking_uri(root))
    version = client_api.get_model_version_by_alias(SCENARIO, "current")
    assert version.tags["role"] == "retrained" and version.tags["shards_retrained"] == "1"
    assert version.tags["shard_origins"].split(",") == ["reused:v1", "trained"]
    receipt = [r for r in read_receipts(root, SCENARIO) if r.exactly_forgotten][0]
    assert receipt.exact_shards.startswith("shard(s) 1 of 2 retrained") and "0 (= v1)" in receipt.exact_shards
    lineage = json.loads(Path(client_api.download_artifacts(version.run_id, "shards.json", str(tmp_path))).read_text())
    assert [s["origin"] for s in lineage["per_shard"]] == ["reused:v1", "trained"]
    mlflow.set_tracking_uri(tracking_uri(root))
    mlflow.set_registry_uri(tracking_uri(root))
    served = mlflow.pytorch.load_model(f"models:/{SCENARIO}/{version.version}")
    weights = ws.registry.load(SCENARIO, version.version)
    x = federation.test.x[:8]
    assert torch.equal(served(x).argmax(1), federation.model_from(weights.state)(x).argmax(1))

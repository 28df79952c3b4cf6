"""A sharded version registers what serves (docs/shards.md): its ``test_acc`` is the served ensemble's,
the model a user loads with ``mlflow.pytorch.load_model`` and scores on the test split — for one
federation (K = 1) and for 2 shards, as trained and after `process --method retrain` forgot a
client exactly (one shard retrained) — and each shard's rounds are its own curve under
``shard_<k>/test_acc``, never in the version's ``test_acc``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from stores.workspace import Workspace
from tasks.data import read_federation
from workspaces import add_sharded_digits, call_cli, init_workspace_at

SCENARIO = "digits-k-hfl"
ROUNDS = 2


@dataclass(frozen=True)
class Measured:
    """One registered version: its run's ``test_acc`` (latest and whole history), the loaded model's
    accuracy on the test split, the steps of each ``shard_<k>/...`` metric of its run and its tags."""

    registered: float
    history: list[float]
    loaded: float
    shard_steps: dict[str, list[int]]
    tags: dict[str, str]


def ok(root: Path, *args: str) -> str:
    printed = call_cli(root, *args)
    assert printed.status == 0, printed.err + printed.out
    return printed.out


def measure(root: Path, version: str) -> Measured:
    import mlflow
    import mlflow.pytorch

    from stores.registry import tracking_uri

    ws = Workspace.open(root)
    found = ws.registry.version(SCENARIO, version)
    history = [m.value for m in ws.registry.client.get_metric_history(found.run_id, "test_acc")]
    test = read_federation(ws, SCENARIO, torch.device("cpu")).test
    mlflow.set_tracking_uri(tracking_uri(root))
    mlflow.set_registry_uri(tracking_uri(root))
    try:
        served = mlflow.pytorch.load_model(f"models:/{SCENARIO}/{version}")  # as a user loads it
    finally:
        # None, not the URIs read before: get_registry_uri() resolves the default, and setting it back
        # would pin every later test of the process to that registry.
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    with torch.no_grad():
        loaded = (served(test.x).argmax(1) == test.y).float().mean().item()
    metrics = ws.registry.metrics(found.run_id)
    shard_steps = {key: [m.step for m in ws.registry.client.get_metric_history(found.run_id, key)]
                   for key in metrics if key.startswith("shard_")}
    return Measured(metrics["test_acc"], history, loaded, shard_steps, dict(found.tags))


@pytest.fixture(scope="module", params=[1, 2], ids=["K=1", "K=2"])
def versions(request, prefect_server, tmp_path_factory) -> tuple[int, Measured, Measured]:
    """K shards trained (v1), then client 0 forgotten by `process --method retrain` (v2); each
    measured before the next step (the exact retrain retires v1's weights)."""
    shards = request.param
    root = init_workspace_at(tmp_path_factory.mktemp(f"k{shards}") / "ws")
    add_sharded_digits(root, SCENARIO, rounds=ROUNDS, shards=shards)
    params = root / "params.yaml"  # the batch's audit trains its reference models: the fewest, briefly
    params.write_text(params.read_text().replace("audit: {num_references: 4, epochs: 20}",
                                                 "audit: {num_references: 2, epochs: 2}", 1))
    ok(root, "train", "--scenario", SCENARIO, "--inline")
    original = measure(root, "1")
    ok(root, "request", "client", "--client", "0", "--scenario", SCENARIO)
    ok(root, "process", "--scenario", SCENARIO, "--method", "retrain")
    return shards, original, measure(root, "2")


def test_the_registered_test_acc_is_the_loaded_model_s_before_and_after_the_exact_retrain(versions):
    shards, original, retrained = versions
    assert retrained.tags["role"] == "retrained"
    if shards > 1:  # the retrain trained client 0's shard alone
        assert retrained.tags["shards_retrained"] != "none" and "reused:v1" in retrained.tags["shard_origins"]
    for measured in (original, retrained):
        assert measured.registered == pytest.approx(measured.loaded, abs=0.005)
        if shards > 1:  # one value, the ensemble's: no shard's round stands in for it
            assert measured.history == [measured.registered]


def test_each_shard_s_rounds_are_its_own_curve(versions):
    shards, original, retrained = versions
    expected = {f"shard_{k}/{name}" for k in range(shards) for name in ("test_acc", "train_loss")}
    assert original.shard_steps == ({key: list(range(1, ROUNDS + 1)) for key in expected} if shards > 1 else {})
    if shards > 1:  # the exact retrain logs the rounds of the shard it trains, and no other's
        trained = retrained.tags["shards_retrained"].split(",")
        assert set(retrained.shard_steps) == {f"shard_{k}/{n}" for k in trained for n in ("test_acc", "train_loss")}

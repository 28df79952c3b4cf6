"""A federation in shards (issue 48; fedunlearn/sharded_federation.py, docs/shards.md):

* K = 1 (or no ``shards`` key) is today's federation, bit for bit;
* an exact retrain of one shard equals training that shard from scratch on its retained data, the
  other shards unchanged — through the ``retrain`` method and through the trainer's ``reuse``;
* the served ensemble weighs each shard by the training samples it holds (a shard shrunk by a
  deletion counts for what is left, an emptied one drops out); a version registered before the
  weights loads with equal weights;
* a client request touches that client's shard only, for every HFL method of the registry (each
  under the conformance suite's tiny federation): the other shard models keep their weights;
* a run killed between a shard's training and the version's registration resumes from the shard
  checkpoints, and its result equals an uninterrupted run's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedunlearn.config import TrainConfig, load_params
from fedunlearn.data.store import partition_scenario, prepare_dataset
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.sharded_federation import ShardedFederation, assign_shards
from fedunlearn.training import load_federation, train
from fedunlearn.unlearning import FederatedState, available_methods, get_method
from fedunlearn.unlearning.registry import get_method_class
from models.ensemble import ShardEnsemble, split_state
from test_method_conformance import FAST, build_federation

PROJECT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


def equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def sharded(shards: int = 2) -> ShardedFederation:
    """The conformance suite's tiny HFL federation (3 clients) in ``shards`` shards, trained."""
    federation = ShardedFederation.of(build_federation("hfl"), shards)
    federation.state = train(federation).state
    return federation


def digits_workspace(root: Path, shards: int | None, rounds: int = 1) -> Path:
    """A copy of the project's params with digits-hfl on 4 clients, ``shards`` set (None: no key),
    ``rounds`` rounds; the digits partition written by the DVC stages' functions."""
    text = (PROJECT / "params.yaml").read_text().replace(
        "    partition: {scheme: dirichlet, num_clients: 3, alpha: 0.5, test_fraction: 0.2}\n"
        "    train: {rounds: 2, local_epochs: 3, lr: 0.05, momentum: 0.9, batch_size: 16}",
        "    partition: {scheme: dirichlet, num_clients: 4, alpha: 0.5, test_fraction: 0.2}\n"
        f"    train: {{rounds: {rounds}, local_epochs: 1, lr: 0.1, batch_size: 16}}"
        + (f"\n    shards: {shards}" if shards is not None else ""), 1)
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(text)
    params = load_params(root / "params.yaml")
    prepare_dataset("digits", params, root, set())
    partition_scenario("digits-hfl", params, root)
    return root


def test_one_shard_is_todays_federation_bit_for_bit(tmp_path):
    absent = digits_workspace(tmp_path / "absent", None)
    one = tmp_path / "one"
    shutil.copytree(absent, one)
    (one / "params.yaml").write_text((absent / "params.yaml").read_text().replace(
        "batch_size: 16}\n  # Audit", "batch_size: 16}\n    shards: 1\n  # Audit", 1))
    params = {root: load_params(root / "params.yaml") for root in (absent, one)}
    assert params[one].scenario("digits-hfl").shards == 1 and "shards: 1" in (one / "params.yaml").read_text()
    federations = {root: load_federation("digits-hfl", params[root], root, CPU) for root in (absent, one)}
    assert all(type(f) is FederatedState for f in federations.values())  # noqa: E721 — not a subclass
    trained = [train(f) for f in federations.values()]
    assert equal_states(trained[0].state, trained[1].state) and trained[0].cost.flops == trained[1].cost.flops


def test_a_retrained_shard_equals_its_training_from_scratch_and_the_others_are_unchanged():
    federation = sharded(2)
    assert federation.shard_of == assign_shards(3, 2, federation.seed) and federation.count == 2
    client = federation.members(0)[0]
    batch = ForgetSet("sample", {client: federation.clients[client].sample_ids[:6]})
    outcome = get_method("retrain", setting="hfl").unlearn(federation, batch)
    before, after = federation.shard_states(), federation.shard_states(outcome.state)
    assert equal_states(before[1], after[1]) and not equal_states(before[0], after[0])
    # From scratch: a federation of the retained data, both shards trained.
    retained = ShardedFederation.of(build_federation("hfl"), 2)
    retained.clients = federation.retained_clients(batch)
    assert equal_states(train(retained).state, outcome.state)
    # The trainer's reuse (the pipeline's exact retrain) gives the same model, training shard 0 only.
    reused = train(retained, reuse={1: before[1]})
    assert equal_states(reused.state, outcome.state) and reused.shard_origins == {0: "trained", 1: "reused"}
    assert outcome.notes["touched_shards"] == [0] and outcome.certificate_inputs["touched_shards"] == [0]
    # Half the data, about half the FLOPs of training both.
    assert 0 < outcome.cost.flops < train(retained).cost.flops


def shard_softmaxes(federation: ShardedFederation, state: dict, x: torch.Tensor) -> list[torch.Tensor]:
    return [torch.softmax(federation.shard(k, state).model_from(s)(x), -1)
            for k, s in enumerate(split_state(state, federation.count))]


def test_the_ensemble_weighs_each_shard_by_what_it_holds_and_drops_a_shard_without_data():
    federation = sharded(3)  # one client per shard
    emptied, shrunk, kept = 1, 0, 2  # a client (its shard) wholly deleted, half of another's samples
    half = federation.clients[shrunk].sample_ids[: len(federation.clients[shrunk]) // 2]
    held = [len(c) for c in federation.clients]
    outcome = get_method("finetune", setting="hfl", rounds=1).unlearn(federation, ForgetSet(
        "sample", {shrunk: half, emptied: federation.clients[emptied].sample_ids}))
    expected = {federation.shard_of[shrunk]: held[shrunk] - len(half), federation.shard_of[emptied]: 0,
                federation.shard_of[kept]: held[kept]}
    assert outcome.state["weights"].tolist() == [expected[k] for k in range(3)]
    assert outcome.state["live"].tolist() == [0.0 if k == federation.shard_of[emptied] else 1.0 for k in range(3)]
    model = federation.model_from(outcome.state)
    assert isinstance(model, ShardEnsemble)
    x = federation.test.x[:5]
    mixture = sum(expected[k] * p for k, p in enumerate(shard_softmaxes(federation, outcome.state, x)))
    assert torch.allclose(torch.softmax(model(x), -1), mixture / sum(expected.values()), atol=1e-6)


def test_a_version_registered_without_weights_serves_its_live_shards_plain_mean():
    """A state dict saved before the ensemble had weights (``live`` only) loads with equal weights."""
    federation = sharded(3)
    old = {k: v for k, v in federation.state.items() if k != "weights"}
    old["live"] = torch.tensor([1.0, 0.0, 1.0])
    model = federation.model_from(old)
    assert model.weights.tolist() == [1.0, 1.0, 1.0] and "weights" not in old  # the caller's dict untouched
    x = federation.test.x[:5]
    softmaxes = shard_softmaxes(federation, old, x)
    assert torch.allclose(torch.softmax(model(x), -1), (softmaxes[0] + softmaxes[2]) / 2, atol=1e-6)
    assert federation.state["weights"].tolist() == [float(n) for n in federation.sizes()]  # trained: its samples


@pytest.mark.parametrize("name", available_methods("hfl"))
def test_every_hfl_method_changes_only_the_shard_a_client_request_touches(name):
    federation = sharded(2)
    kinds = get_method_class(name, "hfl").request_kinds
    kind = "client" if "client" in kinds else "sample"
    client = federation.members(0)[0]
    ids = federation.clients[client].sample_ids
    batch = ForgetSet(kind, {client: ids if kind == "client" else ids[:6]},
                          clients=[client] if kind == "client" else None)
    assert federation.touched(batch) == [federation.shard_of[client]] == [0]
    outcome = get_method(name, setting="hfl", **FAST.get((name, "hfl"), {})).unlearn(federation, batch)
    before, after = federation.shard_states(), federation.shard_states(outcome.state)
    assert equal_states(before[1], after[1]), f"{name} moved shard 1, which holds none of the request"
    assert outcome.state.keys() == federation.state.keys()
    assert all(outcome.state[k].shape == federation.state[k].shape for k in outcome.state)
    assert outcome.cost.flops >= 0 and outcome.notes["touched_shards"] == [0]


def test_a_run_killed_between_shards_resumes_from_the_checkpoints(tmp_path, monkeypatch):
    from flows.train import train_in_shards
    from stores.workspace import Workspace
    import tasks.shards

    root = digits_workspace(tmp_path / "ws", 2)
    ws = Workspace.open(root)
    federation = load_federation("digits-hfl", ws.params, root, CPU)
    assert isinstance(federation, ShardedFederation)
    uninterrupted = train(federation)

    def killed(name: str) -> None:
        raise SystemExit(f"killed at {name}")

    monkeypatch.setattr(tasks.shards, "failpoint", killed)
    with pytest.raises(SystemExit):
        train_in_shards(ws, "digits-hfl", federation, {"role": "original"}, lambda step: None)
    assert len(list(tasks.shards.checkpoint_dir(ws, "digits-hfl").glob("*.pt"))) == 1
    monkeypatch.setattr(tasks.shards, "failpoint", lambda name: None)
    tags: dict[str, str] = {"role": "original"}
    resumed, texts = train_in_shards(ws, "digits-hfl", federation, tags, lambda step: None)
    assert resumed.shard_origins == {0: "reused", 1: "trained"}  # shard 0 from its checkpoint
    assert equal_states(resumed.state, uninterrupted.state)
    assert tags["shard_origins"] == "trained,trained" and tags["shards_retrained"] == "0,1"
    assert '"digest"' in texts[tasks.shards.SHARDS_ARTIFACT]


def test_stacked_shard_training_equals_the_loop_on_the_cpu():
    """The vectorised path (``federation.stacked_fedavg``, the default where CUDA is present) run on
    the CPU: uneven clients and last batches, momentum, two local epochs — the loop's model up to
    float32 summation order, at the same cost."""
    base = build_federation("hfl")
    base.train_config = TrainConfig(rounds=2, lr=0.1, batch_size=7, momentum=0.9, local_epochs=2)
    base.clients[2] = base.clients[2].select(np.arange(len(base.clients[2])) < 17)
    loop, stacked = (ShardedFederation.of(base, 2, vectorised=flag) for flag in (False, True))
    assert stacked.stacks and not loop.stacks
    seen: dict[bool, list] = {False: [], True: []}
    a, b = (train(f, on_round=lambda step, f=f: seen[f.stacks].append((step.shard, step.round))) for f in (loop, stacked))
    # both show each shard's own rounds (its own MLflow curve), never an ensemble in the making
    assert sorted(seen[True]) == sorted(seen[False]) == [(k, r) for k in (0, 1) for r in (1, 2)]
    assert a.state.keys() == b.state.keys()
    assert all(torch.allclose(a.state[k], b.state[k], atol=1e-6, rtol=0) for k in a.state)
    assert (a.cost.flops, a.cost.comm_bytes) == (b.cost.flops, b.cost.comm_bytes)


def test_the_exact_statement_names_the_shards_retrained_and_why_the_others_are_untouched():
    from fedunlearn.receipts import ExactForgetting, Receipt
    from tasks.shards import retrain_statement

    tags = {"role": "retrained", "shards": "3", "shard_origins": "reused:v1,trained,reused:v4"}
    line = retrain_statement(tags)
    assert line.startswith("shard(s) 1 of 3 retrained from scratch (they held the deleted samples)")
    assert "shard(s) 0 (= v1), 2 (= v4) untouched: none held a deleted sample" in line
    assert retrain_statement({"role": "retrained"}) is None  # an unsharded version: nothing to say
    receipt = Receipt.model_construct(exact_shards=line, exactly_forgotten=ExactForgetting(
        at="2026-11-28T00:00:00Z", version="5", by="repay-retrain-debt"), exact_due=None)
    assert line in receipt.exact_owed()

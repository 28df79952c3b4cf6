"""The memorising scenario (issue 25, docs/BENCHMARKS.md "A scenario that memorises"): mislabelled
canaries chosen per ID (stable under deletion, listed in the partition manifest), a digits model that
memorises them, and an audit that calls a no-op on 40 canaries "not forgotten" but not the exact
retrain; the flow-test helper in tests/memorising.py."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from memorising import SCENARIO, canary_request_ids

from fedunlearn.config import ScenarioConfig, load_params
from fedunlearn.data.partition import canary_labels, canary_mask
from fedunlearn.data.store import canary_ids, load_horizontal, partition_scenario, prepare_dataset, read_manifest
from fedunlearn.evaluation.audit import NOT_FORGOTTEN, audit_forgetting, train_audit_set
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.local import accuracy
from fedunlearn.training import load_federation, train
from stores.registry import Registry

IDS = np.array([f"s-{i:05d}" for i in range(5000)])
LABELS = np.arange(5000) % 10


def test_canaries_are_a_per_id_choice_with_a_wrong_label_uniform_over_the_others():
    mask = canary_mask(IDS, seed=0, fraction=0.1)
    assert abs(mask.mean() - 0.1) < 0.015 and np.array_equal(mask, canary_mask(IDS, 0, 0.1))
    assert np.array_equal(mask[::2], canary_mask(IDS[::2], 0, 0.1))      # deleting others moves none
    wrong = canary_labels(IDS, LABELS, seed=0, num_classes=10)
    assert (wrong != LABELS).all() and ((wrong >= 0) & (wrong < 10)).all()
    shifts = np.bincount((wrong - LABELS) % 10, minlength=10)
    assert shifts[0] == 0 and shifts[1:].min() > 0.8 * len(IDS) / 9       # uniform over the other 9
    with pytest.raises(ValueError, match="canary fraction"):
        canary_mask(IDS, 0, 1.0)


def test_canaries_are_for_horizontal_and_decentralised_partitions_only():
    with pytest.raises(ValueError, match="HFL/DFL partitions only"):
        ScenarioConfig.model_validate({"dataset": "wine", "setting": "vfl", "model": "vfl",
                                       "partition": {"scheme": "vertical", "canary_fraction": 0.1}})
    with pytest.raises(ValueError):
        ScenarioConfig.model_validate({"dataset": "digits", "setting": "hfl", "partition": {"canary_fraction": -0.1}})


def partitioned(workspace, params, gone=frozenset()):
    prepare_dataset("digits", params, workspace, set(gone))
    partition_scenario(SCENARIO, params, workspace)
    return load_horizontal(SCENARIO, workspace)


def test_the_partition_relabels_its_canaries_lists_them_and_keeps_them_under_deletion(workspace):
    params = load_params(workspace / "params.yaml")
    with_canaries = partitioned(workspace, params)
    manifest = read_manifest(SCENARIO, workspace)
    ids = canary_ids(manifest)
    train_ids = np.concatenate([c.sample_ids for c in with_canaries.clients])
    assert 60 < len(ids) < 130 and set(ids) <= set(train_ids) and not set(ids) & set(with_canaries.test.sample_ids)
    plain = params.model_copy(deep=True)
    plain.scenarios[SCENARIO].partition.canary_fraction = 0.0
    without = partitioned(workspace, plain)
    assert "canaries" not in read_manifest(SCENARIO, workspace)
    for a, b in zip(with_canaries.clients, without.clients):          # same clients, labels differ at canaries
        assert np.array_equal(a.sample_ids, b.sample_ids)
        assert np.array_equal(np.isin(a.sample_ids, ids), a.labels != b.labels)
    gone = ids[:5] + [str(train_ids[~np.isin(train_ids, ids)][0])]
    after = partitioned(workspace, params, gone)
    assert canary_ids(read_manifest(SCENARIO, workspace)) == ids[5:]
    kept = {sid: label for c in with_canaries.clients for sid, label in zip(c.sample_ids, c.labels)}
    assert all(kept[sid] == label for c in after.clients for sid, label in zip(c.sample_ids, c.labels))


def test_the_scenario_memorises_its_canaries_and_the_audit_tells_a_no_op_from_a_retrain(workspace):
    """Core level, no Prefect: 40 canaries requested; the source model is `not forgotten`, its
    exact retrain is not."""
    torch.manual_seed(0)
    params = load_params(workspace / "params.yaml")
    partitioned(workspace, params)
    federation = load_federation(SCENARIO, params, workspace, torch.device("cpu"))
    original = federation.model_from(train(federation).state)
    batch = ForgetSet.for_sample_ids(canary_request_ids(workspace, 40), federation.clients)
    retrain = federation.model_from(train(dataclasses.replace(federation, clients=federation.retained_clients(batch),
                                                              state={})).state)
    references = train_audit_set(federation.test, lambda: federation.model_from(federation.engine().initial_state()),
                                  config=params.audit, seed=params.seed)
    forget = federation.forget_data(batch)
    # Memorised: the source predicts many of the wrong labels, the retrain none (chance is 1/10).
    assert accuracy(original, forget) > 0.3 and accuracy(retrain, forget) < 0.1
    no_op = audit_forgetting(original, forget, references)
    assert no_op.verdict == NOT_FORGOTTEN and no_op.atypical >= 36, no_op.interval  # told nothing, it finds them
    exact = audit_forgetting(retrain, forget, references)
    assert exact.verdict != NOT_FORGOTTEN and abs(exact.auc - 0.5) < 0.15, exact.interval


def test_the_flow_test_helper_trains_the_scenario_and_names_canaries_to_request(trained_canaries):
    """``train_memorising_workspace`` ran in the fixture's workspace (once per session, copied)."""
    workspace, ids = trained_canaries
    assert len(ids) >= 40 and len(canary_request_ids(workspace, 40)) == 40
    assert canary_request_ids(workspace, 40) == canary_request_ids(workspace, 40)
    assert set(canary_request_ids(workspace, 40)) <= set(ids)
    lineage = json.loads(json.dumps(read_manifest(SCENARIO, workspace)["canaries"]))
    assert lineage["fraction"] == 0.08 and lineage["ids"] == ids
    assert Registry(workspace).by_alias(SCENARIO, "original").tags["role"] == "original"  # trained and registered

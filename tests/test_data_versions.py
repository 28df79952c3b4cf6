"""DVC stages in fresh workspaces: byte-identical outputs, new data version after a deletion,
and Great Expectations stopping a corrupted partition."""

import hashlib
import json

import numpy as np
import pytest
import yaml

from fedunlearn.data.store import PARTITIONS_DIR, load_horizontal
from fedunlearn.requests.ledger import LEDGER_PATH
from stores.validation import ValidationFailed, validate_partition
from stores.workspace import data_version, init_workspace, reproduce, run_dvc


def tree_digest(directory) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_repro_in_two_fresh_workspaces_is_byte_identical(tmp_path, workspace):
    other = init_workspace(tmp_path / "other")
    version = reproduce(workspace, "digits-hfl")
    assert reproduce(other, "digits-hfl") == version == data_version(workspace, "digits-hfl")
    partition = workspace / PARTITIONS_DIR / "digits-hfl"
    assert tree_digest(partition) == tree_digest(other / PARTITIONS_DIR / "digits-hfl")
    report = validate_partition("digits-hfl", workspace)
    assert report["samples"] == 1797


def test_in_process_stages_match_dvc_repro_from_a_shell(tmp_path, workspace):
    """``reproduce`` runs dvc.yaml's stage functions in-process and commits: the same dvc.lock entries and bytes
    as ``dvc repro`` running the stage commands, which then finds nothing to do."""
    other = init_workspace(tmp_path / "shell")
    with open(workspace / LEDGER_PATH, "a") as ledger, open(other / LEDGER_PATH, "a") as copy:
        line = json.dumps({"request_id": "r1", "batch_id": "b1", "sample_ids": ["digits-00003", "digits-00010"]})
        ledger.write(line + "\n")
        copy.write(line + "\n")
    reproduce(workspace, "digits-hfl")
    run_dvc(other, ["repro", "-q", "partition@digits-hfl"])
    assert yaml.safe_load((workspace / "dvc.lock").read_text()) == yaml.safe_load((other / "dvc.lock").read_text())
    assert tree_digest(workspace / PARTITIONS_DIR / "digits-hfl") == tree_digest(other / PARTITIONS_DIR / "digits-hfl")
    assert "partition@digits-hfl" not in run_dvc(workspace, ["status", "partition@digits-hfl"])
    assert "Running stage" not in run_dvc(workspace, ["repro", "partition@digits-hfl"])


def test_ledger_entries_yield_a_new_version_without_the_deleted_samples(workspace):
    before = reproduce(workspace, "digits-hfl")
    old = load_horizontal("digits-hfl", workspace)
    forget = old.clients[1].sample_ids[:5].tolist()
    with open(workspace / LEDGER_PATH, "a") as ledger:
        ledger.write(json.dumps({"request_id": "r1", "batch_id": "b1", "sample_ids": forget}) + "\n")
    after = reproduce(workspace, "digits-hfl")
    assert after != before
    new = load_horizontal("digits-hfl", workspace)
    assert not set(forget) & set(np.concatenate([c.sample_ids for c in new.clients]).tolist())
    # Partition minus ledger: every other sample stays with its client.
    for old_client, new_client in zip(old.clients, new.clients):
        assert set(old_client.sample_ids.tolist()) - set(forget) == set(new_client.sample_ids.tolist())


def test_great_expectations_lists_what_failed(workspace):
    reproduce(workspace, "digits-hfl")
    client = workspace / PARTITIONS_DIR / "digits-hfl" / "client_001"
    labels = np.load(client / "labels.npy")
    labels[0] = 42
    np.save(client / "labels.npy", labels)
    ids = np.load(client / "sample_ids.npy")
    ids[1] = np.load(workspace / PARTITIONS_DIR / "digits-hfl" / "client_000" / "sample_ids.npy")[0]
    np.save(client / "sample_ids.npy", ids)
    with pytest.raises(ValidationFailed) as failure:
        validate_partition("digits-hfl", workspace)
    message = str(failure.value)
    assert "expect_column_values_to_be_between on label" in message and "42" in message
    assert "expect_column_values_to_be_unique on sample_id" in message


def test_vertical_partition_aligns_parties_on_shared_ids(workspace):
    reproduce(workspace, "wine-vfl")
    base = workspace / PARTITIONS_DIR / "wine-vfl"
    manifest = json.loads((base / "manifest.json").read_text())
    assert [p["role"] for p in manifest["parties"]] == ["passive", "passive", "active"]
    widths = [np.load(base / f"party_{p:03d}" / "features.npy").shape[1] for p in range(3)]
    assert sum(widths) == 13
    assert not (base / "party_000" / "labels.npy").exists() and (base / "party_002" / "labels.npy").exists()
    assert validate_partition("wine-vfl", workspace)["splits"] == 4


def test_a_client_emptied_by_deletions_still_validates(workspace):
    reproduce(workspace, "digits-hfl")
    gone = load_horizontal("digits-hfl", workspace).clients[0].sample_ids.tolist()
    with open(workspace / LEDGER_PATH, "a") as ledger:
        ledger.write(json.dumps({"request_id": "r1", "batch_id": "b1", "sample_ids": gone}) + "\n")
    reproduce(workspace, "digits-hfl")
    assert len(load_horizontal("digits-hfl", workspace).clients[0]) == 0
    assert validate_partition("digits-hfl", workspace)["splits"] == 4


def test_reproduce_runs_the_stages_each_time_and_gives_the_same_version_for_the_same_inputs(workspace, monkeypatch):
    """A command reproduces once, where its flow starts, and hands the data version down, so nothing
    is cached between calls: each call runs the stages and commits them; the same inputs give the same
    version, an input edited to the same size a new one, and an output damaged is written again. The
    commit runs in this process and leaves its working directory as it was."""
    import os

    from stores import workspace as module

    cwd = os.getcwd()
    version = reproduce(workspace, "digits-hfl")
    assert os.getcwd() == cwd
    commits = []
    commit = module._commit_stages
    monkeypatch.setattr(module, "_commit_stages", lambda root, scenario: commits.append(scenario) or commit(root, scenario))
    assert reproduce(workspace, "digits-hfl") == version and commits == ["digits-hfl"]

    params = workspace / "params.yaml"
    original = params.read_text()
    edited = original.replace("num_clients: 3, alpha: 0.5", "num_clients: 3, alpha: 0.7")
    assert edited != original and len(edited) == len(original)
    params.write_text(edited)
    assert reproduce(workspace, "digits-hfl") != version and len(commits) == 2
    params.write_text(original)
    assert reproduce(workspace, "digits-hfl") == version and len(commits) == 3

    damaged = workspace / PARTITIONS_DIR / "digits-hfl" / "test" / "labels.npy"
    damaged.write_bytes(b"damaged")
    assert reproduce(workspace, "digits-hfl") == version and len(commits) == 4
    assert damaged.read_bytes() != b"damaged"


def test_opening_a_workspace_leaves_the_ledger_untouched(workspace):
    """Every command opens the workspace: touching the ledger would move its mtime (DVC re-hashes it)."""
    import time

    ledger = workspace / LEDGER_PATH
    before = ledger.stat().st_mtime_ns
    time.sleep(0.02)
    init_workspace(workspace)
    assert ledger.stat().st_mtime_ns == before


def test_params_are_parsed_once_per_content_and_handed_out_as_copies(workspace):
    from fedunlearn.config import load_params

    params = load_params(workspace / "params.yaml")
    params.scenarios.clear()  # a flow overriding its copy changes nobody else's
    assert "digits-hfl" in load_params(workspace / "params.yaml").scenarios
    path = workspace / "params.yaml"
    path.write_text(path.read_text().replace("seed: 0", "seed: 7"))
    assert load_params(path).seed == 7

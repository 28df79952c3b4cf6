"""The memorising scenario for flow tests (issue 25): ``digits-canary-hfl``, whose model memorises
its mislabelled canaries, so that a deletion request for canaries leaves a membership signal the
audit must find in a no-op. Use with the ``workspace`` and ``prefect_server`` fixtures:

    ids = train_memorising_workspace(workspace)          # trains the original (a Prefect flow)
    request = canary_request_ids(workspace, 40)          # 40 seeded canary IDs to request
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedunlearn.data.store import canary_ids, read_manifest

SCENARIO = "digits-canary-hfl"


def canary_request_ids(workspace: Path, count: int | None = None, seed: int = 0) -> list[str]:
    """The canary IDs of ``workspace``'s current partition (all, or ``count`` of them drawn with
    ``seed``), sorted."""
    ids = canary_ids(read_manifest(SCENARIO, workspace))
    if count is not None:
        if count > len(ids):
            raise ValueError(f"{SCENARIO} holds {len(ids)} canaries, fewer than the {count} asked for")
        ids = np.random.default_rng(seed).choice(ids, size=count, replace=False).tolist()
    return sorted(ids)


def train_memorising_workspace(workspace: Path) -> list[str]:
    """``fedunlearn train --scenario digits-canary-hfl --inline`` in ``workspace`` (prepares the data
    version, trains and registers the original): returns all its canary IDs."""
    from cli import main

    if main(["--root", str(workspace), "train", "--scenario", SCENARIO, "--inline"]) != 0:
        raise RuntimeError(f"training {SCENARIO} in {workspace} failed")
    return canary_request_ids(workspace)


def canary_federation(workspace: Path, count: int = 40):
    """digits-canary-hfl partitioned by the DVC stages' functions in ``workspace`` (the project's
    params.yaml; no DVC repository needed), trained, the audit's references with the canary rule,
    and a batch of ``count`` canaries. The federation carries the calibration rows a deletion batch
    gives methods: the references' pool A, never pool B. Returns (federation, training cost,
    references, batch)."""
    import shutil

    import torch

    from fedunlearn.config import load_params
    from fedunlearn.data.store import partition_scenario, prepare_dataset
    from fedunlearn.evaluation.audit import train_audit_set
    from fedunlearn.federation.forget_set import ForgetSet
    from fedunlearn.training import load_federation, train, trained

    shutil.copy(Path(__file__).resolve().parent.parent / "params.yaml", workspace / "params.yaml")
    params = load_params(workspace / "params.yaml")
    prepare_dataset("digits", params, workspace, set())
    partition_scenario(SCENARIO, params, workspace)
    federation = load_federation(SCENARIO, params, workspace, torch.device("cpu"))
    source = train(federation)
    federation = trained(federation, source)
    references = train_audit_set(federation.test, lambda: federation.model_from(federation.engine().initial_state()),
                                  config=params.audit, seed=params.seed)
    federation.calibration = references.calibration_rows(federation.test)
    batch = ForgetSet.for_sample_ids(canary_request_ids(workspace, count), federation.clients)
    return federation, source.cost, references, batch

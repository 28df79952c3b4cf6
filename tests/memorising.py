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

"""A federation in shards in the registry and the workspace (``fedunlearn.sharded_federation``).

* Lineage: a trained version of a sharded scenario carries, per shard, the digest of what its
  from-scratch training depended on and where its model came from — version tags ``shards``,
  ``shard_digests``, ``shard_origins`` (``trained``, or ``reused:v<N>``: the same digest's model,
  trained from scratch for version N), ``shards_retrained`` and ``shard_weights`` (each shard's
  weight in the served ensemble) — and ``shards.json`` on its run (clients, samples, digest, the
  model's hash, origin, weight).
* Exact retrain: only the shards whose digest changed (they held a deleted sample) are trained; a
  shard with a digest an original or retrained version (or a checkpoint) already has is reused.
* Resumption: each shard model trained for a version is checkpointed under
  ``.cache/shards/<scenario>/<digest>.pt`` before the next shard starts; a run killed before the
  version is registered takes them up again, and registration clears them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from fedunlearn.faults import failpoint
from fedunlearn.federation.local import State
from fedunlearn.sharded_federation import ShardedFederation
from fedunlearn.training import TrainedModel
from models.ensemble import state_weights
from stores.workspace import Workspace

SHARDS_ARTIFACT = "shards.json"
EXACT_ROLES = ("original", "retrained", "repaid")  # a repaid version's kept shards carry no digest
AGGREGATION = "log of the mean softmax of the live shards, each weighted by its training samples (weight)"
SHARD_TRAINED = "after-shard-trained"  # failpoint: a shard model checkpointed, the version not registered


def checkpoint_dir(ws: Workspace, scenario: str) -> Path:
    return ws.cache_dir / "shards" / scenario


def save_checkpoint(ws: Workspace, scenario: str, digest: str, state: State) -> None:
    """Shard model ``state`` (trained from scratch on ``digest``), written atomically."""
    folder = checkpoint_dir(ws, scenario)
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f"{digest}.tmp"
    torch.save({k: v.detach().cpu() for k, v in state.items()}, staged)
    os.replace(staged, folder / f"{digest}.pt")
    failpoint(SHARD_TRAINED)


def clear_checkpoints(ws: Workspace, scenario: str) -> None:
    for path in checkpoint_dir(ws, scenario).glob("*.pt"):
        path.unlink(missing_ok=True)


def reusable_shards(ws: Workspace, scenario: str, federation: ShardedFederation, registered: bool
                    ) -> tuple[dict[int, State], dict[int, str]]:
    """Shard models trained from scratch on the digest each shard has now: checkpoints of an
    unfinished run first, then (``registered``) the newest original or retrained version holding it.
    Returns the states and where each came from (``checkpoint`` or ``reused:v<N>``)."""
    digests = {k: federation.digest(k) for k in range(federation.count)}
    states: dict[int, State] = {}
    origins: dict[int, str] = {}
    for index, digest in digests.items():
        path = checkpoint_dir(ws, scenario) / f"{digest}.pt"
        if path.is_file():
            states[index] = {k: v.to(federation.device)
                             for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}
            origins[index] = "checkpoint"
    if registered:
        for version, indices in _holders(ws, scenario, {k: d for k, d in digests.items() if k not in states}).items():
            loaded = federation.shard_states(ws.registry.load(scenario, version).state)
            for index, source in indices.items():
                states[index] = {k: v.to(federation.device) for k, v in loaded[source].items()}
                origins[index] = f"reused:v{version}"
    return states, origins


def _holders(ws: Workspace, scenario: str, wanted: dict[int, str]) -> dict[str, dict[int, int]]:
    """For each wanted shard (index → digest): the newest exact version whose shard of that digest
    was trained from scratch, as version → {wanted index: index in that version}."""
    found: dict[str, dict[int, int]] = {}
    candidates = [v for role in EXACT_ROLES for v in ws.registry.versions(scenario, role=role)]
    for version in sorted(candidates, key=lambda v: -int(v.version)):
        digests = version.tags.get("shard_digests", "").split(",")
        for index, digest in list(wanted.items()):
            if digest in digests:
                found.setdefault(str(version.version), {})[index] = digests.index(digest)
                del wanted[index]
    return found


def shard_lineage(federation: ShardedFederation, trained: TrainedModel, origins: dict[int, str]
                  ) -> tuple[dict[str, str], str]:
    """The version tags and ``shards.json`` of a trained version of a sharded scenario."""
    own = {k: o for k, o in (trained.shard_origins or {}).items() if o == "trained"}
    merged = {k: own.get(k) or ("trained" if origins.get(k) == "checkpoint" else origins.get(k, "trained"))
              for k in range(federation.count)}
    states, weights = federation.shard_states(trained.state), state_weights(trained.state)
    shards = [{"shard": k, "clients": federation.members(k), "samples": sum(len(c) for c in federation.shard(k).clients),
               "digest": federation.digest(k), "origin": merged[k], "live": bool(trained.state["live"][k]),
               "weight": weights[k], "model_sha256": _state_hash(states[k])} for k in range(federation.count)]
    retrained = [str(s["shard"]) for s in shards if s["origin"] == "trained"]
    # A kept shard's model was not trained from scratch on its digest: no later retrain may reuse it.
    tags = {"shards": str(federation.count),
            "shard_digests": ",".join("-" if s["origin"].startswith("kept:") else s["digest"] for s in shards),
            "shard_origins": ",".join(s["origin"] for s in shards), "shards_retrained": ",".join(retrained) or "none",
            "shard_weights": ",".join(f"{w:g}" for w in weights)}
    return tags, json.dumps({"shards": federation.count, "aggregation": AGGREGATION,
                             "assignment": list(federation.shard_of), "per_shard": shards}, indent=2) + "\n"


def _state_hash(state: State) -> str:
    hasher = hashlib.sha256()
    for key in sorted(state):
        hasher.update(key.encode())
        hasher.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return hasher.hexdigest()[:16]


def retrain_statement(tags: dict[str, str]) -> str | None:
    """What an exact retrain of a sharded scenario did, from its version's tags: the shards
    retrained from scratch and why the others are untouched; None for an unsharded version."""
    if "shard_origins" not in tags:
        return None
    origins = tags["shard_origins"].split(",")
    retrained = [str(k) for k, o in enumerate(origins) if o == "trained"]
    kept = {k: o.removeprefix("reused:") for k, o in enumerate(origins) if o != "trained"}
    line = (f"shard(s) {', '.join(retrained) or 'none'} of {len(origins)} retrained from scratch (they held the "
            "deleted samples)")
    if kept:
        line += ("; shard(s) " + ", ".join(f"{k} (= {v})" for k, v in kept.items()) + " untouched: none held a "
                 "deleted sample, so each model is the one trained from scratch on identical data (same digest)")
    return line


def exact_statement(ws: Workspace, scenario: str, version: str) -> str | None:
    """``retrain_statement`` of a registered version: None unless it is a sharded scenario's exact retrain."""
    tags = ws.registry.version(scenario, version).tags
    return retrain_statement(tags) if tags.get("role") == "retrained" else None


def exact_shards_of(tags: dict[str, str]) -> frozenset[int]:
    """The shards of a trained version whose models are trained from scratch on its data (not kept)."""
    return frozenset(k for k, o in enumerate(tags.get("shard_origins", "").split(",")) if o and not o.startswith("kept:"))

"""Reuse of original models across benchmark runs: the same scenario, data version, model,
training configuration, seed and poisoning give the same original, so it is trained once.
Stored as a plain state dict (loaded with ``weights_only=True``) plus its cost, history and
provenance (scenario, data version): an original trained on data a later batch deletes learnt those
samples, and retires with the registered versions once they are exactly forgotten
(``tasks.retirement``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from fedunlearn.benchmark.yardstick import BenchmarkSetup
from fedunlearn.federation.cost import Cost
from fedunlearn.training import TrainedModel

CACHE_DIR = Path("artifacts/originals")


def original_key(setup: BenchmarkSetup, data_version: str, model: str) -> str:
    fed_state = setup.fed_state
    parts = [setup.scenario, data_version, model, fed_state.train_config.model_dump_json(), str(fed_state.seed),
             str(fed_state.device.type)]
    if setup.backdoor:  # the poisoned samples are part of the training data
        parts.append(json.dumps(setup.forget_set.to_dict()["forget_ids"], sort_keys=True))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def load_original(root: Path, key: str, device: torch.device) -> TrainedModel | None:
    weights, meta = root / CACHE_DIR / f"{key}.pt", root / CACHE_DIR / f"{key}.json"
    if not (weights.is_file() and meta.is_file()):
        return None
    info = json.loads(meta.read_text())
    state = torch.load(weights, map_location=device, weights_only=True)
    return TrainedModel(state, Cost(**info["cost"]), info["history"])


def save_original(root: Path, key: str, trained: TrainedModel, scenario: str, data_version: str) -> None:
    directory = root / CACHE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(_to_cpu(trained.state), directory / f"{key}.pt")
    cost = {"wall_seconds": trained.cost.wall_seconds, "flops": trained.cost.flops,
            "comm_bytes": trained.cost.comm_bytes}
    (directory / f"{key}.json").write_text(json.dumps({"cost": cost, "history": trained.history, "scenario": scenario,
                                                       "data_version": data_version}, default=float))


@dataclass(frozen=True)
class CachedOriginal:
    key: str
    weights: Path
    scenario: str | None  # None (with data_version): cached before provenance was recorded
    data_version: str | None


def cached_originals(root: Path) -> list[CachedOriginal]:
    """The cached originals that still have their weights."""
    found = []
    for weights in sorted((root / CACHE_DIR).glob("*.pt")):
        meta = weights.with_suffix(".json")
        info = json.loads(meta.read_text()) if meta.is_file() else {}
        found.append(CachedOriginal(weights.stem, weights, info.get("scenario"), info.get("data_version")))
    return found


def retire(cached: CachedOriginal, batch_id: str) -> None:
    """The weights deleted, the record (cost, history, provenance) kept and told which batch retired them."""
    meta = cached.weights.with_suffix(".json")
    if meta.is_file():
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "retired_by": batch_id}))
    cached.weights.unlink()


def flat_tensors(state: dict) -> list[torch.Tensor]:
    """Every floating-point tensor of a state dict (nested per party for VFL)."""
    return [t for v in state.values() for t in (flat_tensors(v) if isinstance(v, dict) else [v])
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _to_cpu(state: dict) -> dict:
    """A state dict (nested per party for VFL) with every tensor on the CPU."""
    return {k: _to_cpu(v) if isinstance(v, dict) else v.cpu() for k, v in state.items()}

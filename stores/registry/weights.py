"""The weights layout of a registered version: what its files are, by setting, how they are written
and read back, and MLflow's own model (``model/``, the pt2 export) saved beside them.

Each weights file is a plain ``state_dict`` loaded with ``torch.load(..., weights_only=True)``
(nothing from the store is unpickled):

    hfl  weights/weights.pt                        the global model
    vfl  weights/party_<p>/bottom.pt               each party's bottom model: a party fetches its own alone
         weights/party_<p>/top.pt                  the active party's top model
    dfl  weights/weights.pt                        the published model (the nodes' average)
         weights/nodes/node_<i>.pt                 each node's local model
         certified_budget.json                     certified DFU's residual budget, carried to the next batch

plus MLflow's own model (``model/``: the model over full features, for serving), saved with an
input example of zeros — never user data, which would outlive its deletion in every version.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS = "weights"
HFL_WEIGHTS = f"{WEIGHTS}/weights.pt"
BUDGET_ARTIFACT = "certified_budget.json"
MODEL_ARTIFACT = "model"


@dataclass
class ModelWeights:
    """A version's weights as a federation holds them: ``state`` (the global model, or one state
    per party for VFL), the DFL nodes' local models and certified DFU's residual budget."""

    state: dict[str, Any]
    node_states: list[dict[str, torch.Tensor] | None] | None = None
    budget: dict[str, Any] | None = None

    def files(self, setting: str) -> dict[str, dict[str, torch.Tensor]]:
        """Artifact path → state dict (the layout in the module docstring)."""
        if setting == "vfl":
            files = {}
            for party, state in self.state.items():
                for part in ("bottom", "top"):
                    own = {k[len(part) + 1:]: v for k, v in state.items() if k.startswith(f"{part}.")}
                    if own:
                        files[f"{WEIGHTS}/{party}/{part}.pt"] = own
            return files
        files = {HFL_WEIGHTS: self.state}
        for node, state in enumerate(self.node_states or []):
            if state is not None:
                files[f"{WEIGHTS}/nodes/node_{node:03d}.pt"] = state
        return files


def input_example(input_shape: tuple[int, ...]) -> torch.Tensor:
    """What MLflow stores as the model's example input: two rows of zeros, never user data."""
    return torch.zeros((2, *input_shape))


def save_mlflow_model(model: nn.Module, input_shape: tuple[int, ...], path: Path) -> None:
    """MLflow's pytorch model format (``data/model.pt2`` keeps the example it was exported with)."""
    import mlflow.pytorch

    # Named requirements: inferring them runs a subprocess that imports the model, for every version.
    mlflow.pytorch.save_model(model.to("cpu").eval(), str(path),
                              input_example=input_example(input_shape).numpy(),
                              pip_requirements=mlflow.pytorch.get_default_pip_requirements())


def prepare_model_logging() -> None:
    """Save a 2×2 probe model to a temporary directory: a process's first model save pays once for
    importing ``torch.export`` and MLflow's map of installed packages, so a registration that follows
    pays only for its own model. Local files only: no store is touched."""
    with tempfile.TemporaryDirectory() as tmp:
        save_mlflow_model(nn.Linear(2, 2), (2,), Path(tmp) / "probe")


def write_version_files(directory: Path, setting: str, weights: ModelWeights, model: nn.Module,
                        input_shape: tuple[int, ...]) -> None:
    """A version's files under ``directory``, as they are logged to its run: the weights (on the CPU)
    by setting, the budget if any, and MLflow's model."""
    for relative, state in weights.files(setting).items():
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().to("cpu") for k, v in state.items()}, directory / relative)
    if weights.budget is not None:
        (directory / BUDGET_ARTIFACT).write_text(json.dumps(weights.budget, indent=2, sort_keys=True))
    save_mlflow_model(model, input_shape, directory / MODEL_ARTIFACT)


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """One weights file (a plain state dict; nothing unpickled)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def read_weights(setting: str, local: Path) -> ModelWeights:
    """The weights (without the budget) from a downloaded ``weights/`` directory."""
    if setting == "vfl":
        state = {}
        for party in sorted(p for p in local.iterdir() if p.is_dir()):
            state[party.name] = {f"{part.stem}.{k}": v for part in sorted(party.glob("*.pt"))
                                 for k, v in load_state(part).items()}
        if not state:
            raise FileNotFoundError(f"no party weights under {local}")
        return ModelWeights(state)
    weights = ModelWeights(load_state(local / "weights.pt"))
    nodes = sorted((local / "nodes").glob("node_*.pt")) if (local / "nodes").is_dir() else []
    if nodes:
        count = int(nodes[-1].stem.removeprefix("node_")) + 1
        by_index = {int(p.stem.removeprefix("node_")): load_state(p) for p in nodes}
        weights.node_states = [by_index.get(i) for i in range(count)]
    return weights


def read_party(local: Path) -> dict[str, dict[str, torch.Tensor]]:
    """One VFL party's downloaded ``weights/party_<p>/``: ``bottom`` (and ``top``) by name."""
    return {path.stem: load_state(path) for path in sorted(local.glob("*.pt"))}


def tree_digest(directory: Path) -> str:
    """SHA-256 over ``sha256sum``-style lines ("<file SHA-256>  <relative path>"), sorted by path:
    what anyone holding the weights can recompute with ``sha256sum``."""
    lines = sorted(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(directory).as_posix()}\n"
                   for p in Path(directory).rglob("*") if p.is_file())
    return hashlib.sha256("".join(lines).encode()).hexdigest()

"""The served model of a federation in shards: K shard models of one architecture, one answer.

``ShardEnsemble(shards)`` returns the log of the shards' weighted mean softmax — a mixture's
log-probabilities, so ``argmax``, cross-entropy and the audit's confidence read it as they read any
model's logits (SISA, Bourtoule et al. 2021, aggregates its constituents' predictions the same way).
Two buffers, one entry per shard, make it serve what each shard holds:

* ``weights``: shard k's mixture weight, the number of training samples its model stands for (FedAvg
  weighs its clients the same way), so a shard a deletion shrank counts for what it still holds;
* ``live`` (1 or 0): 0 leaves out a shard whose every sample was deleted (its weight is 0 too).

Both are in the ``state_dict`` (one flat dict: ``shards.<k>.<name>``, ``live``, ``weights``), so the
weights are registered, exported (``torch.export``) and loaded with the version. A state dict saved
before the ensemble had weights (no ``weights`` entry) loads with equal weights, as it served.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

WEIGHTS = "weights"


class ShardEnsemble(nn.Module):
    def __init__(self, shards: Sequence[nn.Module]):
        super().__init__()
        if not shards:
            raise ValueError("a shard ensemble needs at least one shard model")
        self.shards = nn.ModuleList(shards)
        self.register_buffer("live", torch.ones(len(shards)))
        self.register_buffer(WEIGHTS, torch.ones(len(shards)))
        self.register_load_state_dict_pre_hook(_equal_weights_if_absent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_probs = torch.stack([torch.log_softmax(shard(x), dim=-1) for shard in self.shards])
        # log Σ_k w_k p_k − log Σ_k w_k; a dead shard (w_k = 0) weighs log 0 = −inf.
        weights = self.live * self.weights
        log_weights = torch.log(weights).view(-1, *([1] * (log_probs.dim() - 1)))
        return torch.logsumexp(log_probs + log_weights, dim=0) - torch.log(weights.sum())


def _equal_weights_if_absent(module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
    """A version registered before shards were weighted served their plain mean: it still does."""
    if f"{prefix}live" in state_dict and f"{prefix}{WEIGHTS}" not in state_dict:
        state_dict[f"{prefix}{WEIGHTS}"] = torch.ones_like(state_dict[f"{prefix}live"])


def shard_prefix(index: int) -> str:
    """The key prefix of shard ``index``'s entries in a ``ShardEnsemble`` state dict."""
    return f"shards.{index}."


def split_state(state: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """An ensemble's state dict as its ``count`` shard models' state dicts."""
    return [{k[len(shard_prefix(i)):]: v for k, v in state.items() if k.startswith(shard_prefix(i))}
            for i in range(count)]


def join_states(states: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """The ensemble state dict of shard states, shard k weighing ``weights[k]`` (its training samples;
    0: it has no model to contribute)."""
    if any(w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"shard weights must be non-negative with one positive at least, got {list(weights)}")
    joined = {f"{shard_prefix(i)}{k}": v for i, state in enumerate(states) for k, v in state.items()}
    device = next(iter(joined.values())).device if joined else None
    joined["live"] = torch.tensor([1.0 if w > 0 else 0.0 for w in weights], device=device)
    joined[WEIGHTS] = torch.tensor([float(w) for w in weights], device=device)
    return joined


def state_weights(state: dict[str, torch.Tensor]) -> list[float]:
    """The mixture weights an ensemble state dict serves (equal among the live shards where it records none)."""
    live = state["live"].tolist()
    recorded = state[WEIGHTS].tolist() if WEIGHTS in state else [1.0] * len(live)
    return [w if alive else 0.0 for w, alive in zip(recorded, live)]


__all__ = ["ShardEnsemble", "WEIGHTS", "join_states", "shard_prefix", "split_state", "state_weights"]

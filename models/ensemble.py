"""The served model of a federation in shards: K shard models of one architecture, one answer.

``ShardEnsemble(shards)`` returns the log of the shards' mean softmax — a mixture's log-probabilities,
so ``argmax``, cross-entropy and the audit's confidence read it as they read any model's logits
(SISA, Bourtoule et al. 2021, aggregates its constituents' predictions the same way). The buffer
``live`` (one entry per shard, 1 or 0) leaves out a shard whose every sample was deleted: it has no
model to contribute. Its ``state_dict`` is one flat dict (``shards.<k>.<name>``, ``live``), so it
is registered, exported (``torch.export``) and loaded like any single model.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class ShardEnsemble(nn.Module):
    def __init__(self, shards: Sequence[nn.Module]):
        super().__init__()
        if not shards:
            raise ValueError("a shard ensemble needs at least one shard model")
        self.shards = nn.ModuleList(shards)
        self.register_buffer("live", torch.ones(len(shards)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_probs = torch.stack([torch.log_softmax(shard(x), dim=-1) for shard in self.shards])
        # log Σ_k w_k p_k − log Σ_k w_k, with w_k ∈ {0, 1}: a dead shard weighs log 0 = −inf.
        log_weights = torch.log(self.live).view(-1, *([1] * (log_probs.dim() - 1)))
        return torch.logsumexp(log_probs + log_weights, dim=0) - torch.log(self.live.sum())


def shard_prefix(index: int) -> str:
    """The key prefix of shard ``index``'s entries in a ``ShardEnsemble`` state dict."""
    return f"shards.{index}."


def split_state(state: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """An ensemble's state dict as its ``count`` shard models' state dicts."""
    return [{k[len(shard_prefix(i)):]: v for k, v in state.items() if k.startswith(shard_prefix(i))}
            for i in range(count)]


def join_states(states: Sequence[dict[str, torch.Tensor]], live: Sequence[bool]) -> dict[str, torch.Tensor]:
    """The ensemble state dict of shard states (``live[k]``: shard k has a model to contribute)."""
    joined = {f"{shard_prefix(i)}{k}": v for i, state in enumerate(states) for k, v in state.items()}
    device = next(iter(joined.values())).device if joined else None
    joined["live"] = torch.tensor([1.0 if alive else 0.0 for alive in live], device=device)
    return joined


__all__ = ["ShardEnsemble", "join_states", "shard_prefix", "split_state"]

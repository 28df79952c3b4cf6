"""Cost accounting: wall time, FLOPs and bytes, after the PUF paper's Appendix B (Cost Estimation
Methodology; puf-negated-pseudo-gradients.txt, Tables VII–VIII).

Notation (Table VII): P model parameters, B bytes per parameter (4 for float32), |S_t| clients
participating in round t, F FLOPs per sample ("per image"), N samples per client, E local
epochs, C clients (in a method's formula: C_r remaining, C_u unlearning clients), R rounds.

- Communication per round: ``2·P·B·|S_t|`` — every participant downloads the global model and
  uploads its own (downlink + uplink), summed over rounds.
- Computation per training round: ``F·N·E·C``; over R rounds of the same shape, ``F·N·E·C·R``
  (the recovery phase is ``F·N·E·C_r·R_rec``).

FLOPs convention (ours; the paper states F as a per-image constant without saying what it
counts): ``flops_per_sample`` counts one forward pass with ``torch.utils.flop_counter``, where a
multiply-add is 2 FLOPs and only matrix products and convolutions are counted (activations,
pooling and normalisation are cheap next to them), and multiplies it by 3 for a training step:
the backward pass costs about twice the forward (gradients with respect to activations and to
weights). Our F for ResNet-18 is not the paper's Table VII value (docs/methods.md, "Cost
accounting"), so compare speed-ups (ratios), not absolute FLOPs, with the paper's tables.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

BYTES_PER_FLOAT32 = 4
# Backward ≈ 2× forward (activation gradients + weight gradients), so a training step ≈ 3× forward.
TRAINING_STEP_OVER_FORWARD = 3


def communication_bytes(num_params: int, clients_per_round: int | Sequence[int], rounds: int | None = None,
                        *, bytes_per_param: int = BYTES_PER_FLOAT32) -> int:
    """Σ_t 2·P·B·|S_t| bytes. ``clients_per_round`` is either |S_t| for each round (a sequence;
    then ``rounds`` is implied) or one |S_t| shared by ``rounds`` rounds (default 1)."""
    if isinstance(clients_per_round, numbers.Integral):
        participants = [int(clients_per_round)] * (1 if rounds is None else rounds)
    else:
        if rounds is not None:
            raise ValueError("give either a per-round sequence of participants or rounds, not both")
        participants = list(clients_per_round)
    if num_params < 0 or bytes_per_param <= 0 or any(count < 0 for count in participants):
        raise ValueError("parameters, participants and rounds must be non-negative and bytes_per_param positive")
    return sum(2 * num_params * bytes_per_param * count for count in participants)


def training_flops(flops_per_sample: float, num_samples: int, epochs: int, clients: int = 1,
                   rounds: int = 1) -> float:
    """F·N·E·C·R: ``flops_per_sample`` F (training FLOPs, see ``flops_per_sample``), N samples per
    client, E local epochs, C clients per round, R rounds. With clients of unequal size, pass the
    round's total Σ n_i as ``num_samples`` and ``clients=1``: F·E·Σ n_i is what was computed."""
    if min(flops_per_sample, num_samples, epochs, clients, rounds) < 0:
        raise ValueError("FLOPs, samples, epochs, clients and rounds must be non-negative")
    return float(flops_per_sample) * num_samples * epochs * clients * rounds


def flops_per_sample(model: nn.Module, input_shape: tuple[int, ...], *, include_backward: bool = True) -> int:
    """FLOPs of one sample of shape ``input_shape`` (without the batch dimension): one forward
    pass measured by ``FlopCounterMode`` (multiply-add = 2 FLOPs), ×3 for forward + backward
    unless ``include_backward`` is False. Runs in eval mode (batch-norm layers reject a batch of
    one in training mode) and restores the model's mode."""
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None else torch.get_default_dtype()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, *input_shape, device=device, dtype=dtype))
    finally:
        model.train(was_training)
    forward = counter.get_total_flops()
    return forward * TRAINING_STEP_OVER_FORWARD if include_backward else forward


def speedup(retrain_seconds: float, seconds: float) -> float:
    """How many times cheaper than retraining: ``retrain_seconds / seconds`` (any cost unit works,
    as long as both arguments use it)."""
    if seconds <= 0:
        raise ValueError(f"cost must be positive to compute a speed-up, got {seconds}")
    return retrain_seconds / seconds


@dataclass(frozen=True)
class Cost:
    """What a phase cost; records add up across phases (e.g. unlearning + recovery)."""

    wall_seconds: float = 0.0
    flops: float = 0.0
    comm_bytes: int = 0
    # Where the FLOPs went, by part (a method's own names: "teacher", "retained", "recovery", ...);
    # empty where a method does not split them.
    parts: dict[str, float] = field(default_factory=dict)

    def __add__(self, other: "Cost") -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        parts = dict(self.parts)
        for name, flops in other.parts.items():
            parts[name] = parts.get(name, 0.0) + flops
        return Cost(self.wall_seconds + other.wall_seconds, self.flops + other.flops,
                    self.comm_bytes + other.comm_bytes, parts)

    def speedups(self, retrain: "Cost") -> dict[str, float | None]:
        """``retrain / self`` per cost; None where this record's cost is 0 (not measured)."""
        return {name: speedup(getattr(retrain, name), getattr(self, name)) if getattr(self, name) > 0 else None
                for name in ("wall_seconds", "flops", "comm_bytes")}

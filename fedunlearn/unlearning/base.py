"""The one interface every unlearning method follows (scikit-learn-like).

A method is configured with keyword hyperparameters and then applied to a trained federation:

    method = get_method("ga", recovery_rounds=2)
    outcome = method.unlearn(fed_state, forget_set)

* ``ForgetSet`` — which sample IDs to forget at which client (resolved from client IDs,
  class labels, explicit sample IDs or a seeded fraction of chosen clients' samples).
* ``FederatedState`` — what a method may use from the original training: the trained state,
  the ORIGINAL clients' data (including what must be forgotten), the training configuration.
* ``Outcome`` — the new state, its cost, the numbers its certificate needs and the metrics
  recorded along the way.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Generic, TypeVar

import numpy as np
import torch
from torch import nn

from fedunlearn.config import TrainConfig
from fedunlearn.data.store import HorizontalPartition
from fedunlearn.federation.forget_set import ForgetSet, check_client_index
from fedunlearn.federation.cost import Cost, communication_bytes, flops_per_sample, training_flops
from fedunlearn.federation.fedavg import FedAvg, MapUpdates, RoundResult, map_inline
from fedunlearn.federation.local import State, Tensors, accuracy, predict_logits

SETTINGS = ("hfl", "vfl", "dfl")


@dataclass
class FederatedState:
    """What an unlearning method may use from the original training.

    ``clients`` are the ORIGINAL clients' data, including the samples to forget; methods ask for
    ``retained_clients(batch)`` or ``forget_data(batch)``. ``map_updates`` runs client-side work
    (inline by default; the flows inject Prefect task mapping), as in ``FedAvg.run_round``.
    ``calibration``: held-out rows the audit never uses as non-members (its references' pool A),
    or None: what never-seen samples look like, for a method that sizes its strength per batch
    (``calibration_reached``). The audit's own non-members (pool B) are never given to a method.
    """

    setting: str
    model_fn: Callable[[], nn.Module]
    state: dict[str, Any]
    clients: list[Tensors]
    test: Tensors
    train_config: TrainConfig
    seed: int
    device: torch.device
    num_classes: int
    map_updates: MapUpdates = map_inline
    calibration: Tensors | None = None

    @classmethod
    def from_partition(cls, partition: HorizontalPartition, *, model_fn: Callable[[], nn.Module],
                       state: State, train_config: TrainConfig, seed: int, device: torch.device,
                       setting: str = "hfl") -> "FederatedState":
        def tensors(split) -> Tensors:
            return Tensors.from_arrays(split.features, split.labels, split.sample_ids, device)

        return cls(setting, model_fn, state, [tensors(c) for c in partition.clients], tensors(partition.test),
                   train_config, seed, device, partition.num_classes)

    def engine(self) -> FedAvg:
        """The training's own FedAvg engine: same model_fn, configuration, seed and device."""
        return FedAvg(self.model_fn, self.train_config, self.seed, self.device)

    def model_from(self, state: State) -> nn.Module:
        return self.engine().model_from(state)

    def flops_per_sample(self) -> int:
        """Training FLOPs (forward + backward) of one sample, the F of PUF Appendix B."""
        return flops_per_sample(self.model_fn().to(self.device), tuple(self.test.x.shape[1:]))

    def forget_masks(self, forget_set: ForgetSet) -> dict[int, np.ndarray]:
        """Per affected client, a boolean mask over its samples; checks every ID is held there."""
        masks = {}
        for client, ids in forget_set.forget_ids.items():
            held = self.clients[check_client_index(client, self.clients)].sample_ids
            masks[client] = np.isin(held, ids)
            if masks[client].sum() != len(np.unique(ids)):
                missing = np.setdiff1d(ids, held)[:5].tolist()
                raise ValueError(f"{forget_set.batch_id}: client {client} does not hold sample ID(s) {missing}")
        return masks

    def retained_clients(self, forget_set: ForgetSet) -> list[Tensors]:
        """Every client minus its forget IDs (a fully removed client becomes empty)."""
        masks = self.forget_masks(forget_set)
        return [c.select(~masks[i]) if i in masks else c for i, c in enumerate(self.clients)]

    def forget_by_client(self, forget_set: ForgetSet) -> dict[int, Tensors]:
        return {i: self.clients[i].select(mask) for i, mask in self.forget_masks(forget_set).items()}

    def forget_data(self, forget_set: ForgetSet) -> Tensors:
        """All forget samples, concatenated in client order."""
        parts = list(self.forget_by_client(forget_set).values())
        return Tensors(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]),
                       np.concatenate([p.sample_ids for p in parts]))


@dataclass(frozen=True)
class Calibration:
    """One rung of a strength ladder judged against the calibration rows: the forget samples' mean
    loss at their labels and the calibration rows' mean loss, both under the candidate state."""

    forget_loss: float
    calibration_loss: float

    @property
    def reached(self) -> bool:
        return self.forget_loss >= self.calibration_loss


def calibration_reached(fed_state: FederatedState, state: State, forget: Tensors) -> Calibration:
    """Whether ``state`` leaves the forget samples at least as unfamiliar as never-seen ones: their
    mean cross-entropy at their labels against that of ``fed_state.calibration``, both under the
    same model (the step moves the whole model; what matters is the forget set against never-seen
    samples under it). Needs ``fed_state.calibration``."""
    if fed_state.calibration is None or len(fed_state.calibration) == 0:
        raise ValueError("calibration_reached needs the federation's calibration rows (held-out, outside pool B)")
    model = fed_state.model_from(state)
    model.eval()
    with torch.no_grad():
        losses = [float(torch.nn.functional.cross_entropy(predict_logits(model, data.x), data.y))
                  for data in (forget, fed_state.calibration)]
    return Calibration(*losses)


Rung = TypeVar("Rung")


@dataclass
class Climb(Generic[Rung]):
    """A strength ladder as climbed: every rung computed, cheapest first (the last is the one kept;
    each was paid for), what each judged rung read (``ladder``, the outcome's ``strength`` note) and
    whether the kept rung reached the calibration level (None: nothing was judged)."""

    climbed: list[Rung]
    ladder: list[dict[str, Any]]
    reached: bool | None

    @property
    def chosen(self) -> Rung:
        return self.climbed[-1]


def calibrated_forget(fed_state: FederatedState, forget_set: ForgetSet, max_doublings: int) -> Tensors | None:
    """The forget samples a ladder is judged on, or None where there is no ladder to climb: no
    calibration rows, or ``max_doublings=0`` (the chosen strength, unjudged)."""
    return fed_state.forget_data(forget_set) if fed_state.calibration is not None and max_doublings > 0 else None


def climb_ladder(fed_state: FederatedState, forget: Tensors | None, rungs: Iterable[Rung],
                 state_of: Callable[[Rung], State], describe: Callable[[Rung], dict[str, Any]]) -> Climb[Rung]:
    """Climb ``rungs`` (computed lazily, cheapest first) until one's state reaches the calibration
    level (``calibration_reached``); every rung when none does. With ``forget=None`` the first rung
    is kept unjudged, so a method without a ladder runs exactly its chosen strength."""
    climbed: list[Rung] = []
    ladder: list[dict[str, Any]] = []
    for rung in rungs:
        climbed.append(rung)
        if forget is None:
            return Climb(climbed, ladder, None)
        judged = calibration_reached(fed_state, state_of(rung), forget)
        ladder.append({"rung": len(ladder), **describe(rung), "forget_loss": judged.forget_loss,
                       "calibration_loss": judged.calibration_loss, "reached": judged.reached})
        if judged.reached:
            return Climb(climbed, ladder, True)
    return Climb(climbed, ladder, False)


@dataclass
class Outcome:
    """``state``: the new global state dict (for VFL/DFL a dict of states per party/node)."""

    state: dict[str, Any]
    cost: Cost = field(default_factory=Cost)
    certificate_inputs: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


class Monitor:
    """Records test and forget accuracy along the way. Its own time is kept so that ``unlearn``
    can leave it out of the method's wall time: watching a method is not part of its cost."""

    def __init__(self, fed_state: FederatedState, forget_set: ForgetSet):
        self.fed_state = fed_state
        self.forget = fed_state.forget_data(forget_set)
        self.history: list[dict[str, Any]] = []
        self.seconds = 0.0

    def record(self, phase: str, round_idx: int, state: State, **metrics: float) -> None:
        start = time.perf_counter()
        model = self.fed_state.model_from(state)
        self.history.append({"phase": phase, "round": round_idx, "test_acc": accuracy(model, self.fed_state.test),
                             "forget_acc": accuracy(model, self.forget), **metrics})
        self.seconds += time.perf_counter() - start


def num_params(state: State) -> int:
    """P of PUF Appendix B: the floating-point entries of a model (what is exchanged)."""
    return sum(v.numel() for v in state.values() if torch.is_floating_point(v))


def fedavg_rounds(fed_state: FederatedState, clients: Sequence[Tensors], *, state: State | None, rounds: int,
                  first_round: int, phase: str, monitor: Monitor) -> tuple[State, Cost]:
    """``rounds`` rounds of the training's FedAvg engine, each recorded by ``monitor`` and costed
    by PUF Appendix B: 2·P·B·|S_t| bytes and F·E·Σ_{i∈S_t} n_i FLOPs per round. ``state=None``
    starts from the seeded initial model; ``first_round`` keeps later phases' shuffling seeds
    apart from the original training's."""
    if rounds == 0:  # FedAvg.fit reads rounds=0 as "the configured number of rounds"
        return state, Cost()
    participants: list[int] = []
    samples: list[int] = []

    def after_round(result: RoundResult) -> None:
        participants.append(len(result.updates))
        samples.append(sum(u.num_samples for u in result.updates))
        monitor.record(phase, result.round - first_round + 1, result.state, train_loss=result.train_loss)

    final = fed_state.engine().fit(clients, state=state, rounds=rounds, first_round=first_round,
                                   map_updates=fed_state.map_updates, on_round=after_round)
    flops = training_flops(fed_state.flops_per_sample(), sum(samples), fed_state.train_config.local_epochs)
    return final, Cost(flops=flops, comm_bytes=communication_bytes(num_params(final), participants))


class UnlearningMethod(ABC):
    """Base class: set the class attributes, validate hyperparameters in ``__init__`` (keyword
    only, documented defaults) and implement ``_unlearn``. Register with ``@register``."""

    name: ClassVar[str]
    settings: ClassVar[frozenset[str]]
    request_kinds: ClassVar[frozenset[str]]
    guarantee: ClassVar[str]
    # Its place in the default escalation (``unlearning.escalation``), read from the class that
    # declares it (a subclass inherits none): per setting, or per (setting, request kind) where that
    # differs, ``"default"`` (the first attempt), ``"fallback"`` or ``"last-resort"``; ``rank`` orders
    # the methods of one role. Its stronger attempt: the hyperparameters multiplied
    # (``stronger_scales``) and set (``stronger_switches``); neither: it has no stronger attempt.
    roles: ClassVar[Mapping[str | tuple[str, str], str]] = {}
    rank: ClassVar[int] = 0
    stronger_scales: ClassVar[tuple[str, ...]] = ()
    stronger_switches: ClassVar[Mapping[str, Any]] = {}

    def get_params(self) -> dict[str, Any]:
        """The hyperparameters, read from ``__init__``'s signature as scikit-learn does."""
        parameters = inspect.signature(type(self).__init__).parameters.values()
        names = [p.name for p in parameters if p.name != "self"
                 and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        return {p: getattr(self, p) for p in names}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each hyperparameter's default, read from ``__init__``'s signature."""
        return {p.name: p.default for p in inspect.signature(cls.__init__).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def _require(self, ok: bool, hyperparameter: str, expectation: str) -> None:
        if not ok:
            raise ValueError(f"{self.name}: {hyperparameter} must be {expectation}, "
                             f"got {getattr(self, hyperparameter)!r}")

    @classmethod
    def supports(cls, setting: str | None = None, kind: str | None = None) -> bool:
        """Whether the method applies to ``setting`` and ``kind``; ``None`` matches any."""
        return (setting is None or setting in cls.settings) and (kind is None or kind in cls.request_kinds)

    @classmethod
    def check_supported(cls, setting: str | None = None, kind: str | None = None) -> None:
        if not cls.supports(setting, kind):
            requested = ", ".join(f"{what} {value!r}" for what, value in (("setting", setting), ("kind", kind))
                                  if value is not None)
            raise ValueError(f"method {cls.name!r} does not support {requested}; "
                             f"it supports settings {sorted(cls.settings)} and request kinds "
                             f"{sorted(cls.request_kinds)}")

    def unlearn(self, fed_state: FederatedState, forget_set: ForgetSet) -> Outcome:
        self.check_supported(fed_state.setting, forget_set.kind)
        if forget_set.num_forget >= sum(len(c) for c in fed_state.clients):
            raise ValueError(f"{forget_set.batch_id} removes all training data; nothing would be retained")
        by_shard = getattr(fed_state, "unlearn_by_shard", None)  # a federation in shards: each touched shard alone
        if by_shard is not None:
            return by_shard(self, forget_set)
        monitor = Monitor(fed_state, forget_set)  # also checks that every forget ID is held where the batch says
        start = time.perf_counter()
        outcome = self._unlearn(fed_state, forget_set, monitor)
        outcome.cost = dataclasses.replace(outcome.cost, wall_seconds=time.perf_counter() - start - monitor.seconds)
        outcome.history = monitor.history
        return outcome

    @abstractmethod
    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        """The method itself: return the new state, its comm/FLOP cost and certificate inputs."""

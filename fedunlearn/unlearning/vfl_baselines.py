"""The baselines of FedORA's experiments (fedora-vfl-primal-dual-unlearning.txt, §V-A4) in the
vertical setting, on the split-NN engine (``fedunlearn.federation.vertical``); they serve the
names ``retrain`` and ``ga`` for ``setting="vfl"``, next to the HFL classes of the same names.

``VerticalRetrain`` — train-from-scratch, the gold standard: split-NN training with exactly the
original configuration (the same seed, hence every party's initial weights and the shuffling;
the same ``TrainConfig`` and number of epochs) on the aligned samples minus the forget IDs. No
hyperparameters: anything that differed from the original training would make it a different
reference. Certificate class ``exact retrain``.

``VerticalGradientAscent`` — gradient ascent (Gu et al., 2024; Varshney et al., 2025, the GA of
FedORA's Tables IV–V): from the trained model, the parties maximise the cross-entropy on the
forget set through the split network, each party clipping its own gradient (a global clip would
need every party's share of the norm), until a mini-batch loss exceeds ``stop_loss`` or the
epochs run out; then optional recovery epochs of ordinary split-NN training on the retained data.
Certificate class ``empirical only``.

Hyperparameters of ``VerticalGradientAscent`` (default; the paper gives none for GA):
    lr: ascent step (None: the training's ``TrainConfig.lr``).
    epochs: ascent epochs over the forget set (5, as the HFL ``ga``).
    batch_size: ascent mini-batch (None: ``TrainConfig.batch_size``).
    clip_norm: per-party gradient-norm clip (5.0, as the HFL ``ga``).
    stop_loss: stop once a forget mini-batch's cross-entropy exceeds it (None: ln C, the loss of
        a uniform guess; beyond it the model is not uncertain but wrong).
    recovery_epochs: split-NN epochs on the retained data afterwards (1; the HFL ``ga`` runs 2
        FedAvg rounds of one local epoch on retained data, and one epoch already costs 1/rounds
        of a retrain here).

Cost of both: the bytes that crossed the channel and F per sample back-propagated
(``VerticalState.cost_since``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedunlearn.certify.certificate import EMPIRICAL_ONLY, EXACT_RETRAIN
from fedunlearn.federation.vertical import VerticalState
from fedunlearn.unlearning.base import ForgetSet, Monitor, Outcome, UnlearningMethod
from fedunlearn.unlearning.registry import register


@register
class VerticalRetrain(UnlearningMethod):
    name = "retrain"
    settings = frozenset({"vfl"})
    request_kinds = frozenset({"sample", "class"})
    guarantee = EXACT_RETRAIN

    def _unlearn(self, fed_state: VerticalState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        federation = fed_state.federation
        before = federation.meter()
        _, retained = fed_state.positions(forget_set)
        result = federation.fit(retained, state=None,
                                on_epoch=lambda epoch, state, loss: monitor.record("unlearn", epoch, state,
                                                                                   train_loss=loss))
        epochs = fed_state.train_config.rounds
        return Outcome(result.state, fed_state.cost_since(before),
                       certificate_inputs={"epochs": epochs, "retained_samples": len(retained),
                                           "forget_samples": forget_set.num_forget},
                       notes={"epochs": epochs})


@register
class VerticalGradientAscent(UnlearningMethod):
    name = "ga"
    # FedORA's sample objective pushes the forget samples to uncertainty: its own setting is a share
    # of chosen classes; arbitrary samples of a model that generalises it over-forgets (docs/methods.md).
    roles = {"vfl": "fallback", ("vfl", "sample"): "default"}
    stronger_scales = ("epochs",)
    settings = frozenset({"vfl"})
    request_kinds = frozenset({"sample", "class"})
    guarantee = EMPIRICAL_ONLY

    def __init__(self, *, lr: float | None = None, epochs: int = 5, batch_size: int | None = None,
                 clip_norm: float = 5.0, stop_loss: float | None = None, recovery_epochs: int = 1):
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.clip_norm = clip_norm
        self.stop_loss = stop_loss
        self.recovery_epochs = recovery_epochs
        self._require(lr is None or lr > 0, "lr", "> 0 or None")
        self._require(isinstance(epochs, int) and epochs >= 1, "epochs", "an integer >= 1")
        self._require(batch_size is None or (isinstance(batch_size, int) and batch_size >= 1), "batch_size",
                      "an integer >= 1 or None")
        self._require(clip_norm > 0, "clip_norm", "> 0")
        self._require(stop_loss is None or stop_loss > 0, "stop_loss", "> 0 or None")
        self._require(isinstance(recovery_epochs, int) and recovery_epochs >= 0, "recovery_epochs",
                      "an integer >= 0")

    def _unlearn(self, fed_state: VerticalState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        federation = fed_state.federation
        before = federation.meter()
        forget, retained = fed_state.positions(forget_set)
        rounds = fed_state.train_config.rounds
        stop_loss = self.stop_loss if self.stop_loss is not None else math.log(fed_state.num_classes)
        loss_before = _forget_loss(fed_state, fed_state.state, forget)

        def ascent(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return -F.cross_entropy(logits, labels)

        ascended = federation.fit(forget, state=fed_state.state, epochs=self.epochs, first_epoch=rounds, lr=self.lr,
                                  batch_size=self.batch_size, loss_fn=ascent, clip_norm=self.clip_norm,
                                  stop=lambda loss: -loss > stop_loss)
        loss_after = _forget_loss(fed_state, ascended.state, forget)
        monitor.record("unlearn", 1, ascended.state, forget_loss=loss_after)
        state = ascended.state
        if self.recovery_epochs:
            state = federation.fit(retained, state=state, epochs=self.recovery_epochs,
                                   first_epoch=rounds + self.epochs,
                                   on_epoch=lambda epoch, s, loss: monitor.record("recovery", epoch, s,
                                                                                  train_loss=loss)).state
        numbers = {"forget_loss_before": loss_before, "forget_loss_after": loss_after, "stop_loss": stop_loss,
                   "ascent_steps": ascended.steps, "early_stopped": ascended.stopped_early,
                   "recovery_epochs": self.recovery_epochs}
        return Outcome(state, fed_state.cost_since(before), certificate_inputs=numbers,
                       notes={"ascent_steps": ascended.steps, "early_stopped": ascended.stopped_early})


@torch.no_grad()
def _forget_loss(fed_state: VerticalState, state: dict, forget: torch.Tensor) -> float:
    """Cross-entropy on the forget set, computed federatedly (it counts as cost: it is part of
    the method's record)."""
    federation = fed_state.federation
    federation.load_state(state)
    return float(F.cross_entropy(federation.logits(forget), federation.active.labels_of(forget)))

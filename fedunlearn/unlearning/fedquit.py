"""FedQUIT: federated unlearning by distillation from a quasi-competent virtual teacher [1]_.

The teacher is the global model at the time of the request, with each forget sample's labelled
logit lowered to ``suppress`` ("min": the lowest other logit; "mean": their mean): it still ranks
the other classes as the model does — "quasi-competent" — but no longer vouches for the label. For
``rounds`` FedAvg rounds every client trains on its retained data, and a client holding forget
samples adds a distillation term towards the teacher on them (hyperparameters: ``FedQUIT``).

Why: the gradient at a sample the model has memorised is near zero, so methods that start from it
(PUF, HF-KCU, gradient ascent, fine-tuning) cannot remove what was memorised; the distance between
the model's logits and the teacher's is largest for exactly those samples. It is the HFL
escalation's last resort before an exact retrain, and its first attempt where the source model
remembers the forget set; class requests are refused. The distance is by default the squared
logit distance (distillation's high-temperature limit [2]_, logit matching [3]_), not the paper's
softmax KL at T = 1, whose gradient on the labelled logit vanishes while the log-odds a membership
audit reads are still high.

Two solvers of that objective: ``"edit"`` (the default) solves it in closed form on the hidden layer
below the output, at the cost of forward passes over the forget rows and a bounded sample of every
client's retained rows (``fedunlearn.unlearning.layer_edit``); ``"steps"`` descends it by the paper's
FedAvg rounds. The escalation tries the edit first and the steps after it. The local step, the other
departures from the paper and why, and where each fails: docs/methods.md, "fedquit".

References
----------
.. [1] Mora, Valerio, Bellavista and Passarella (2024), "FedQUIT: On-Device Federated Unlearning
   via a Quasi-Competent Virtual Teacher", arXiv:2408.07587.
.. [2] Hinton, Vinyals and Dean (2015), "Distilling the Knowledge in a Neural Network",
   arXiv:1503.02531: the T² scaling of a softened KL, and logit matching as its high-T limit.
.. [3] Ba and Caruana (2014), "Do Deep Nets Really Need to be Deep?", NeurIPS: regression on logits.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.config import TrainConfig
from fedunlearn.federation.cost import TRAINING_STEP_OVER_FORWARD, Cost, communication_bytes
from fedunlearn.federation.fedavg import ClientUpdate, aggregate
from fedunlearn.federation.local import State, Tensors, accuracy, objective, predict_logits
from fedunlearn.unlearning.base import (ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod,
                                        fedavg_rounds, num_params)
from fedunlearn.unlearning.layer_edit import (EditLayers, EditUnsupported, HiddenEdit, activations, edit_layers,
                                              hidden_edit, retained_factor, retained_system, sample_rows)
from fedunlearn.unlearning.registry import register

SUPPRESSIONS = ("min", "mean")
DISTANCES = ("squared", "huber")
PARTICIPANTS = ("holders", "all")
ANCHORS = ("labels", "source")
SOLVERS = ("edit", "steps")
EDIT_SETTINGS = ("retained_rows", "retained_weight", "ridge", "edit_passes")  # read by the edit alone
STEPS_RECOVERY_ROUNDS = 2   # recovery after the steps, where ``recovery_rounds`` is None


@dataclass
class QuitUpdate(ClientUpdate):
    samples_processed: int = 0  # forward + backward passes, for the FLOP count
    forget_samples: int = 0     # teacher forward passes
    retained_processed: int = 0
    forget_processed: int = 0
    anchor_passes: int = 0      # the step's starting model's forward passes on retained rows (``anchor="source"``)


def virtual_teacher(logits: torch.Tensor, labels: torch.Tensor, suppress: str) -> torch.Tensor:
    """The teacher's logits: ``logits`` with each row's labelled entry replaced by the minimum
    or the mean of that row's other entries."""
    labelled = F.one_hot(labels, logits.shape[1]).bool()
    if suppress == "min":
        fill = logits.masked_fill(labelled, float("inf")).amin(dim=1)
    else:
        fill = logits.masked_fill(labelled, 0.0).sum(dim=1) / (logits.shape[1] - 1)
    return torch.where(labelled, fill[:, None], logits)


def quitting_targets(forget: dict[int, Tensors], forget_set: ForgetSet) -> dict[int, Tensors]:
    """Per client, the forget samples the quitting term applies to: those the batch's per-sample
    evidence calls remembered (all of them where nothing was measured). A forget sample the source
    does not remember is left to what the retained data teaches, as a retrain leaves it: pushing its
    labelled logit down would mark it wrong where a retrain keeps it right (docs/methods.md)."""
    targets = {c: data.select(forget_set.is_remembered(data.sample_ids)) for c, data in forget.items()}
    return {c: data for c, data in targets.items() if len(data)}


@register
class FedQUIT(UnlearningMethod):
    """FedQUIT (module docstring): HFL sample and client requests.

    Parameters
    ----------
    solver : {"edit", "steps"}, default="edit"
        "edit": the objective solved in closed form on the hidden layer below the output, for a model
        that ends Linear → ReLU → Linear (another model gets the steps, and the outcome says so);
        "steps": ``rounds`` FedAvg rounds of local steps (the paper's protocol).
    retained_rows : int, default=400
        with the edit, the retained rows each client samples for the term that holds the model on
        retained data.
    retained_weight : float, default=30.0
        μ, that term's weight against the forget rows' (the mean over the sampled rows).
    ridge : float, default=1e-3
        ε, the edit's ridge: the edit stays small in directions no row constrains.
    edit_passes : int, default=2
        passes of the edit: each after the first edits again, from the edited model, the targets it
        still predicts with their label (the first pass linearises at the source's activations).
    rounds : int, default=5
        R, unlearning rounds, each a FedAvg round with the forget term (the steps).
    local_epochs : int, default=1
        local epochs per round over each client's retained data.
    forget_weight : float, default=0.1
        λ, the weight of the distillation term on the forget samples (sized for the squared logit
        distance, whose scale is the logits' own, not the KL's).
    suppress : {"min", "mean"}, default="min"
        the labelled logit's value in the virtual teacher: the lowest or the mean of the other logits
        ("mean" leaves a memorised sample's log-odds higher).
    temperature : float or None, default=None
        None for the logit distance ``distance``; T > 0 for T²·KL at temperature T (T = 1 is the
        paper's loss).
    lr : float or None, default=None
        local step size (None: the training's ``TrainConfig.lr``; momentum and batch size are always
        the training's).
    recovery_rounds : int or None, default=None
        FedAvg rounds on the retained data afterwards, without the forget term: they restore test
        accuracy the forget term cost, at the price of a little of the signal coming back. None: 2
        after the steps (where the frontier keeps test accuracy within a point of the retrain's:
        docs/BENCHMARKS.md), 0 after the edit (which holds the retained outputs by construction).
    distance : {"squared", "huber"}, default="squared"
        the logit distance when ``temperature`` is None: squared, or Huber (smooth L1, a bounded
        gradient per logit).
    clip_norm : float or None, default=5.0
        the local steps' gradient norm is clipped to this (None: no clipping); the squared logit
        distance grows with the logits' scale, which grows as a model trains towards memorisation.
    participants : {"all", "holders"}, default="all"
        who takes part in the quitting rounds: the engine's client sample plus every client holding
        a quitting target ("all"), or those clients alone ("holders": the others' update would be
        ordinary training on data the model has already fitted).
    local_steps : int or None, default=None
        None: ``local_epochs`` epochs over the client's retained data each round; an integer: that
        many steps, each on ``retained_batch`` retained rows (a bounded sample of them) and the
        client's forget mini-batch — the cost then follows the forget set, not the client's data.
    retained_batch : int or None, default=None
        retained rows a step with ``local_steps`` (None: the training's batch size; 0: none).
    target_test_acc : float or None, default=None
        the test accuracy recovery aims at (a deletion batch passes its source's); read only with
        ``recovery_tolerance``.
    recovery_tolerance : float or None, default=None
        None: every recovery round runs; a number: recovery stops as soon as the test accuracy is
        within it of ``target_test_acc``, checked before each round (each check's forward passes
        counted), so recovery is sized by what the utility check needs.
    anchor : {"labels", "source"}, default="labels"
        what a quitting client's retained rows are fitted to: their labels (cross-entropy), or the
        outputs of the round's starting model on them (squared logit distance: the step then changes
        the model on the forget rows and holds it elsewhere, at one forward pass a retained row).
    """

    name = "fedquit"
    # The edit first; its stronger attempt is the paper's FedAvg rounds.
    roles = {"hfl": "last-resort"}
    stronger_switches = {"solver": "steps"}
    settings = frozenset({"hfl"})
    # Not "class": a retrain without a class never predicts it on any input; the teacher only
    # changes the forget inputs' targets, so the class would live on elsewhere.
    request_kinds = frozenset({"sample", "client"})
    guarantee = EMPIRICAL_ONLY

    def __init__(self, *, solver: str = "edit", retained_rows: int = 400, retained_weight: float = 30.0,
                 ridge: float = 1e-3, edit_passes: int = 2, rounds: int = 5, local_epochs: int = 1,
                 forget_weight: float = 0.1, suppress: str = "min", temperature: float | None = None, lr: float | None = None,
                 recovery_rounds: int | None = None,
                 distance: str = "squared", clip_norm: float | None = 5.0, participants: str = "all",
                 local_steps: int | None = None, retained_batch: int | None = None,
                 target_test_acc: float | None = None, recovery_tolerance: float | None = None, anchor: str = "labels"):
        self.solver = solver
        self.retained_rows = retained_rows
        self.retained_weight = retained_weight
        self.ridge = ridge
        self.edit_passes = edit_passes
        self.rounds = rounds
        self.local_epochs = local_epochs
        self.forget_weight = forget_weight
        self.suppress = suppress
        self.temperature = temperature
        self.lr = lr
        self.recovery_rounds = recovery_rounds
        self.distance = distance
        self.clip_norm = clip_norm
        self.participants = participants
        self.local_steps = local_steps
        self.retained_batch = retained_batch
        self.target_test_acc = target_test_acc
        self.recovery_tolerance = recovery_tolerance
        self.anchor = anchor
        self._require(solver in SOLVERS, "solver", f"one of {', '.join(SOLVERS)}")
        self._require(isinstance(retained_rows, int) and retained_rows >= 1, "retained_rows", "an integer >= 1")
        self._require(isinstance(retained_weight, (int, float)) and retained_weight >= 0, "retained_weight", ">= 0")
        self._require(isinstance(ridge, (int, float)) and ridge > 0, "ridge", "> 0")
        self._require(isinstance(edit_passes, int) and edit_passes >= 1, "edit_passes", "an integer >= 1")
        self._require(anchor in ANCHORS, "anchor", f"one of {', '.join(ANCHORS)}")
        self._require(participants in PARTICIPANTS, "participants", f"one of {', '.join(PARTICIPANTS)}")
        self._require(local_steps is None or (isinstance(local_steps, int) and local_steps >= 1), "local_steps",
                      "an integer >= 1 or None")
        self._require(retained_batch is None or (isinstance(retained_batch, int) and retained_batch >= 0),
                      "retained_batch", "an integer >= 0 or None")
        self._require(target_test_acc is None or 0 <= target_test_acc <= 1, "target_test_acc", "in [0, 1] or None")
        self._require(recovery_tolerance is None or (isinstance(recovery_tolerance, (int, float))
                                                     and 0 <= recovery_tolerance < 1), "recovery_tolerance",
                      "in [0, 1) or None")
        self._require(distance in DISTANCES, "distance", f"one of {', '.join(DISTANCES)}")
        self._require(clip_norm is None or clip_norm > 0, "clip_norm", "> 0 or None")
        self._require(isinstance(rounds, int) and rounds >= 1, "rounds", "an integer >= 1")
        self._require(isinstance(local_epochs, int) and local_epochs >= 1, "local_epochs", "an integer >= 1")
        self._require(isinstance(forget_weight, (int, float)) and forget_weight > 0, "forget_weight", "> 0")
        self._require(suppress in SUPPRESSIONS, "suppress", f"one of {', '.join(SUPPRESSIONS)}")
        self._require(temperature is None or temperature > 0, "temperature", "> 0 or None")
        self._require(lr is None or lr > 0, "lr", "> 0 or None")
        self._require(recovery_rounds is None or (isinstance(recovery_rounds, int) and recovery_rounds >= 0),
                      "recovery_rounds", "an integer >= 0 or None")

    def recovery_for(self, solver: str) -> int:
        """The recovery rounds run after ``solver``: ``recovery_rounds``, or where None its default."""
        if self.recovery_rounds is not None:
            return self.recovery_rounds
        return 0 if solver == "edit" else STEPS_RECOVERY_ROUNDS

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        forget = quitting_targets(fed_state.forget_by_client(forget_set), forget_set)
        retained = fed_state.retained_clients(forget_set)
        unsupported = None
        if self.solver == "edit":
            try:
                source = fed_state.model_from(fed_state.state)
                layers = edit_layers(source)
                activations(source, layers, torch.zeros_like(fed_state.test.x[:1]))
            except EditUnsupported as why:
                unsupported = f"{why}: the steps ran instead"
            else:
                return self._unlearn_by_edit(fed_state, forget_set, forget, retained, layers, monitor)
        outcome = self._unlearn_by_steps(fed_state, forget_set, forget, retained, monitor)
        if unsupported:
            outcome.notes["solver"] = unsupported
        return outcome

    def _unlearn_by_edit(self, fed_state: FederatedState, forget_set: ForgetSet, forget: dict[int, Tensors],
                         retained: list[Tensors], layers: EditLayers, monitor: Monitor) -> Outcome:
        """The edit (``layer_edit``): every client's retained factor, each holder's edit for its
        targets, their sum; then ``recovery_for("edit")`` rounds. Nothing to edit (no target): no
        client is asked for anything."""
        factors = fed_state.map_updates(self._client_factor, [
            {"fed_state": fed_state, "layers": layers, "rows": rows, "client": c}
            for c, rows in enumerate(retained) if len(rows) and forget])
        if not factors:
            return Outcome(dict(fed_state.state), Cost(parts={"retained": 0.0, "teacher": 0.0, "solve": 0.0}),
                           certificate_inputs={**self.get_params(), "solver": "edit", "quitting_samples": 0},
                           notes={"solver": "edit", "target_clients": [], "participants_per_round": [0],
                                  "recovery_rounds_run": 0})
        stacked = torch.cat(factors)
        system, system_flops = retained_system(stacked, retained_weight=self.retained_weight, ridge=self.ridge)
        state, edits = {key: value.clone() for key, value in fed_state.state.items()}, []
        for number in range(self.edit_passes):
            passed = fed_state.map_updates(self._holder_edit, [
                {"fed_state": fed_state, "state": state, "layers": layers, "forget": forget[c], "system": system,
                 "only_predicted": number > 0} for c in sorted(forget)])
            for edit in passed:
                state[f"{layers.hidden}.weight"] += edit.weight
                state[f"{layers.hidden}.bias"] += edit.bias
            edits += passed
            monitor.record("unlearn", number + 1, state)
        cost = self._edit_cost(fed_state, stacked, forget, edits, layers, participants=len(factors),
                               system_flops=system_flops)
        rounds = self.recovery_for("edit")
        state, recovery, recovered = self._recover(fed_state, retained, state, fed_state.train_config.rounds, monitor,
                                                   rounds)
        notes = {"solver": "edit", "edited_layer": layers.hidden, "target_clients": sorted(forget),
                 "participants_per_round": [len(factors)], "retained_rows": int(len(stacked)),
                 "recovery_rounds_run": recovered, "distance": "squared logits, solved on the hidden layer"}
        numbers = {**self.get_params(), "forget_samples": forget_set.num_forget,
                   "quitting_samples": sum(len(t) for t in forget.values()), **notes}
        return Outcome(state, cost + recovery, certificate_inputs=numbers, notes=notes)

    def _client_factor(self, fed_state: FederatedState, layers: EditLayers, rows: Tensors, client: int) -> torch.Tensor:
        """A client's share of the retained term: its sampled rows' rotated factor."""
        sample, generator = sample_rows(rows, self.retained_rows, fed_state.seed, client)
        return retained_factor(fed_state.model_from(fed_state.state), layers, sample, generator)

    def _holder_edit(self, fed_state: FederatedState, state: State, layers: EditLayers, forget: Tensors,
                     system: torch.Tensor, only_predicted: bool) -> HiddenEdit:
        """A holder's edit of ``state``: its targets' logits to the virtual teacher (the source's, fixed
        over the passes), the retained term held."""
        teacher = self.teacher_logits(fed_state.model_from(fed_state.state), forget)
        return hidden_edit(fed_state.model_from(state), layers, forget, teacher, system, only_predicted=only_predicted)

    @staticmethod
    def _edit_cost(fed_state: FederatedState, stacked: torch.Tensor, forget: dict[int, Tensors],
                   edits: list[HiddenEdit], layers: EditLayers, participants: int, system_flops: float) -> Cost:
        """Forward passes (a third of a training pass a row): the sampled retained rows, and the
        targets twice a pass (the teacher's logits, then the edited layers' rows); the server's
        factorisation and the holders' solves; and the bytes: the model to every participant, the
        factors up, the Cholesky factor down to each holder, the edits up."""
        per_sample = fed_state.flops_per_sample()
        parts = {"retained": per_sample * len(stacked) / TRAINING_STEP_OVER_FORWARD,
                 "teacher": per_sample * 2 * sum(e.forward_rows for e in edits) / TRAINING_STEP_OVER_FORWARD,
                 "solve": float(system_flops + sum(edit.solve_flops for edit in edits))}
        edit_size = sum(fed_state.state[f"{layers.hidden}.{k}"].numel() for k in ("weight", "bias"))
        width = stacked.shape[1]
        floats = num_params(fed_state.state) * participants + stacked.numel() + width * width * len(edits) + \
            edit_size * len(edits)
        return Cost(flops=float(sum(parts.values())), comm_bytes=int(4 * floats), parts=parts)

    def _unlearn_by_steps(self, fed_state: FederatedState, forget_set: ForgetSet, forget: dict[int, Tensors],
                          retained: list[Tensors], monitor: Monitor) -> Outcome:
        """The paper's protocol: ``rounds`` FedAvg rounds with the quitting term, then recovery."""
        state, first = fed_state.state, fed_state.train_config.rounds  # fresh shuffling seeds after training
        updates: list[QuitUpdate] = []
        participants: list[int] = []
        for r in range(self.rounds):
            round_updates = self._round(fed_state, state, retained, forget, first + r)
            state = aggregate(state, round_updates)
            updates += round_updates
            participants.append(len(round_updates))
            monitor.record("unlearn", r + 1, state)
        cost = self._cost(fed_state, updates, participants)
        state, recovery, recovered = self._recover(fed_state, retained, state, first + self.rounds, monitor,
                                                   self.recovery_for("steps"))
        quit_samples = sum(len(t) for t in forget.values())
        numbers = {**self.get_params(), "target_clients": sorted(forget), "forget_samples": forget_set.num_forget,
                   "quitting_samples": quit_samples, "participants_per_round": participants,
                   "recovery_rounds_run": recovered}
        return Outcome(state, cost + recovery, certificate_inputs=numbers,
                       notes={"solver": "steps", "target_clients": sorted(forget), "participants_per_round": participants,
                              "recovery_rounds_run": recovered,
                              "distance": "squared logits" if self.temperature is None else "T²·KL"})

    def _round(self, fed_state: FederatedState, state: State, retained: list[Tensors], forget: dict[int, Tensors],
               round_idx: int) -> list[QuitUpdate]:
        """One FedAvg round: every target client (its forget work cannot be skipped) and, with
        ``participants="all"``, the engine's client sample on the retained data; each client's
        update mapped like FedAvg's. With ``"holders"`` the others sit the round out: their update
        would be ordinary training on data the model has already fitted."""
        sampled = [] if self.participants == "holders" and forget else \
            fed_state.engine().select_clients(round_idx, retained)
        jobs = [{"fed_state": fed_state, "state": state, "retained": retained[c], "forget": forget.get(c),
                 "client": c, "round_idx": round_idx} for c in sorted(set(sampled) | set(forget))
                if len(retained[c]) or c in forget]  # a client with nothing left to step through sits out
        return fed_state.map_updates(self._local_update, jobs)

    def _recover(self, fed_state: FederatedState, retained: list[Tensors], state: State, first_round: int,
                 monitor: Monitor, rounds_due: int) -> tuple[State, Cost, int]:
        """``rounds_due`` rounds on the retained data without the forget term. With a
        ``recovery_tolerance`` (and the batch's ``target_test_acc``) they stop as soon as the test
        accuracy is within it of the target, checked before each round (each check counted)."""
        if self.recovery_tolerance is None or self.target_test_acc is None:
            if self.local_steps is None:
                state, spent = fedavg_rounds(fed_state, retained, state=state, rounds=rounds_due,
                                             first_round=first_round, phase="recovery", monitor=monitor)
                return state, dataclasses.replace(spent, parts={"recovery": spent.flops}), rounds_due
        cost, rounds = Cost(), 0
        while rounds < rounds_due:
            if self.recovery_tolerance is not None and self.target_test_acc is not None:
                cost = cost + self._check_cost(fed_state)
                if accuracy(fed_state.model_from(state), fed_state.test) >= self.target_test_acc - \
                        self.recovery_tolerance:
                    break
            state, spent = self._recovery_round(fed_state, retained, state, first_round + rounds, rounds + 1, monitor)
            cost, rounds = cost + spent, rounds + 1
        return state, cost, rounds

    def _recovery_round(self, fed_state: FederatedState, retained: list[Tensors], state: State, round_idx: int,
                        number: int, monitor: Monitor) -> tuple[State, Cost]:
        """One recovery round: the training's FedAvg round, or, with ``local_steps``, that many bounded
        steps a client on the engine's client sample."""
        if self.local_steps is None:
            state, spent = fedavg_rounds(fed_state, retained, state=state, rounds=1, first_round=round_idx,
                                         phase="recovery", monitor=monitor)
            return state, dataclasses.replace(spent, parts={"recovery": spent.flops})
        round_updates = self._round(fed_state, state, retained, {}, round_idx)
        state = aggregate(state, round_updates)
        monitor.record("recovery", number, state)
        return state, self._cost(fed_state, round_updates, [len(round_updates)], part="recovery")

    @staticmethod
    def _check_cost(fed_state: FederatedState) -> Cost:
        """One forward pass over the test split (a third of a training pass a row)."""
        flops = fed_state.flops_per_sample() * len(fed_state.test) / TRAINING_STEP_OVER_FORWARD
        return Cost(flops=float(flops), parts={"recovery_checks": float(flops)})

    def _local_update(self, fed_state: FederatedState, state: State, retained: Tensors, forget: Tensors | None,
                      client: int, round_idx: int) -> QuitUpdate:
        """One client's local steps: mini-batch SGD on its retained data, plus, on a target
        client, λ times the distance to the virtual teacher on a cycling mini-batch of its forget
        samples at every step. A client with nothing retained steps through its forget data."""
        teacher = self._teacher(fed_state, forget) if forget is not None and len(forget) else None
        return self.local_update(fed_state.model_from(state), retained, forget, teacher, fed_state.train_config,
                                 seed=fed_state.seed, round_idx=round_idx, client=client)

    def local_update(self, model: nn.Module, retained: Tensors, forget: Tensors | None, teacher: torch.Tensor | None,
                     config: TrainConfig, *, seed: int, round_idx: int, client: int) -> QuitUpdate:
        """``_local_update``'s steps from ``model`` (the global one), wherever the client runs (here, or
        a Flower ClientApp: ``fedunlearn_flower.fedquit``); ``teacher``: ``teacher_logits`` on ``forget``."""
        model.train()
        # The anchor holds a quitting client's other outputs in place; recovery fits the labels again.
        anchor = copy.deepcopy(model).eval() if self.anchor == "source" and teacher is not None else None
        optimizer = torch.optim.SGD(model.parameters(), lr=self.lr or config.lr, momentum=config.momentum)
        generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, round_idx, client])
                                                      .generate_state(1)[0]))
        retained_seen = forget_seen = 0
        total = 0.0
        for index, picked in self._schedule(retained, forget if teacher is not None else None, config, generator):
            loss = torch.zeros((), dtype=next(model.parameters()).dtype, device=retained.x.device)
            if index is not None and anchor is not None:
                with torch.no_grad():
                    kept = anchor(retained.x[index])
                loss = loss + F.mse_loss(model(retained.x[index]), kept, reduction="sum") / len(index)
                retained_seen += len(index)
            elif index is not None:
                loss = loss + objective(model, retained.x[index], retained.y[index])
                retained_seen += len(index)
            if picked is not None:
                loss = loss + self.forget_weight * self._distance(model(forget.x[picked]), teacher[picked])
                forget_seen += len(picked)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_norm)
            optimizer.step()
            total = float(loss.detach())
        n_forget = 0 if forget is None else len(forget)
        return QuitUpdate(client, {k: v.detach() for k, v in model.state_dict().items()}, len(retained) + n_forget,
                          total, samples_processed=retained_seen + forget_seen,
                          forget_samples=n_forget if teacher is not None else 0,
                          retained_processed=retained_seen, forget_processed=forget_seen,
                          anchor_passes=retained_seen if anchor is not None else 0)

    def _schedule(self, retained: Tensors, forget: Tensors | None, config: TrainConfig,
                  generator: torch.Generator):
        """Each local step's retained rows and forget rows (either None where there are none).
        ``local_steps=None``: ``local_epochs`` epochs over the retained data (over the forget data
        where nothing is retained). Otherwise ``local_steps`` steps, each on ``retained_batch`` rows
        (the training's batch size where None) cycling through one shuffle of the retained data:
        a bounded sample of it, not the whole of it."""
        device = retained.x.device if len(retained) else forget.x.device
        size = config.batch_size
        cycle = None
        if self.local_steps is None:
            over = retained if len(retained) else forget
            step = 0
            for _ in range(self.local_epochs):
                order = torch.randperm(len(over), generator=generator).to(device)
                cycle = torch.randperm(len(forget), generator=generator).to(device) if forget is not None else None
                for start in range(0, len(over), size):
                    yield (order[start:start + size] if len(retained) else None), self._pick(cycle, step, size)
                    step += 1
            return
        width = size if self.retained_batch is None else self.retained_batch
        order = torch.randperm(len(retained), generator=generator).to(device) if len(retained) and width else None
        cycle = torch.randperm(len(forget), generator=generator).to(device) if forget is not None else None
        for step in range(self.local_steps):
            index = None if order is None else order[torch.arange(step * width, (step + 1) * width,
                                                                  device=device) % len(order)][:len(order)]
            yield index, self._pick(cycle, step, size)

    @staticmethod
    def _pick(cycle: torch.Tensor | None, step: int, size: int) -> torch.Tensor | None:
        """Step ``step``'s forget rows: the next ``size`` of the cycling shuffle (all of them when fewer)."""
        if cycle is None:
            return None
        return cycle[torch.arange(step * size, (step + 1) * size, device=cycle.device) % len(cycle)][:len(cycle)]

    def _teacher(self, fed_state: FederatedState, forget: Tensors) -> torch.Tensor:
        """The virtual teacher's logits on ``forget``, from the model at the request (fixed over
        the rounds, so the rounds converge toward one target)."""
        return self.teacher_logits(fed_state.model_from(fed_state.state), forget)

    def teacher_logits(self, source: nn.Module, forget: Tensors) -> torch.Tensor:
        """The virtual teacher's logits on ``forget`` from ``source``, the model at the request."""
        logits = predict_logits(source, forget.x)
        return virtual_teacher(logits, forget.y.to(logits.device), self.suppress)

    def _distance(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        if self.temperature is None and self.distance == "huber":
            return F.smooth_l1_loss(student, teacher, reduction="sum", beta=1.0) / len(student)
        if self.temperature is None:
            return F.mse_loss(student, teacher, reduction="sum") / len(student)
        t = self.temperature
        return F.kl_div(F.log_softmax(student / t, dim=1), F.softmax(teacher / t, dim=1), reduction="batchmean") * t * t

    @staticmethod
    def _cost(fed_state: FederatedState, updates: list[QuitUpdate], participants: list[int],
              part: str | None = None) -> Cost:
        """Training passes of every local step, one teacher forward pass (a third of a training
        pass) per forget sample per round, and a download + upload per participant per round;
        split into the teacher's passes, the forget rows' and the retained rows' (``part``: all of
        it under that one name, as for recovery)."""
        per_sample = fed_state.flops_per_sample()
        split = {"teacher": per_sample * sum(u.forget_samples + u.anchor_passes for u in updates)
                 / TRAINING_STEP_OVER_FORWARD,
                 "forget": float(per_sample * sum(u.forget_processed for u in updates)),
                 "retained": float(per_sample * sum(u.retained_processed for u in updates))}
        flops = float(sum(split.values()))
        parts = {part: flops} if part else split
        return Cost(flops=flops, comm_bytes=communication_bytes(num_params(fed_state.state), participants), parts=parts)

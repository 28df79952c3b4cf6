"""The ClientApp: what a SuperNode computes on its own data, one handler per message type.

Every handler loads the node's own partition (``partition.own_split``), computes, and replies with
a model, a vector or counts — never with a sample. The node's partition comes from its node
configuration (``partition-id``; the simulation engine sets it, a SuperNode is started with
``--node-config "partition-id=<i>"``), its data from ``data-root`` in the node configuration, or
else from the workspace named in the message (one machine: the local deployment, the simulation).

Message types (the server side: ``federation.Federation``):

* ``query.partition`` → the partition ID and its sample count (how the server maps node IDs to
  clients, and FedAvg's n_i).
* ``train`` → the FedAvg local update from the sent model: ``local-epochs`` epochs of SGD on
  ``subset`` (all, forget or retained, given ``forget-ids``), shuffled from (seed, round, client)
  exactly as ``fedunlearn.federation.fedavg.FedAvg.local_update`` does — it is that function.
* ``query.gradient`` → g_i, the gradient of the SUM of per-sample objective terms over the forget
  samples (HF-KCU, Algorithm 1 line 4).
* ``query.hvp`` → H_j·v, H_j the Hessian of the mean objective over the retained samples (or a
  seeded mini-batch of ``hessian-batch`` of them), by double backprop (HF-KCU, federation Hessian).
* ``query.krylov`` → HF-KCU's whole step on the client's own curvature (the paper's line 5).
* ``train.fedquit`` → one FedQUIT round's local update: SGD on the retained data plus, on the
  samples of ``quit-ids``, the distance to the virtual teacher built from the ``teacher`` model.
* ``train.ascent`` → gradient ascent's (PGA's) projected ascent on the forget samples, within
  ``radius`` of the ``reference`` model.

The two method rounds run the core method's own client code (``FedQUIT.local_update``,
``GradientAscent.ascend``), built from the hyperparameters the message carries in
``method-params`` (JSON: a configuration record cannot hold None, which several defaults are).
"""

from __future__ import annotations

import json

import numpy as np
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedunlearn.config import TrainConfig
from fedunlearn.federation.fedavg import FedAvg
from fedunlearn.federation.local import Tensors
from fedunlearn_flower.partition import CPU, Scenario, own_split
from fedunlearn_flower.partition import subset as select
from fedunlearn_flower.records import METRICS, REFERENCE, STATE, TEACHER, VECTOR, config_of, record_state, \
    record_vector, state_record, vector_record

app = ClientApp()


class _Job:
    """A message's job at this node: the scenario, the node's partition ID and the chosen subset."""

    def __init__(self, message: Message, context: Context, subset: str | None = None):
        self.config = config_of(message)
        root = str(context.node_config.get("data-root") or self.config["root"])
        self.scenario = Scenario.load(root, str(self.config["scenario"]))
        self.client = int(context.node_config["partition-id"])
        which = subset or str(self.config.get("subset", "all"))
        self.own = own_split(root, self.scenario.name, self.client)
        self.data = select(self.own, which, list(self.config.get("forget-ids", [])))
        # One intra-op thread: the in-process engine's tests run with one, and the float results
        # match bit for bit only with the same reduction order; a SuperNode per core is the layout.
        torch.set_num_threads(int(self.scenario.config.threads or 1))

    def model(self, message: Message) -> torch.nn.Module:
        model = self.scenario.model_fn().to(CPU)
        model.load_state_dict(record_state(message.content.array_records[STATE]))
        return model


def _reply(message: Message, job: _Job, metrics: dict | None = None, **records) -> Message:
    counts = MetricRecord({"partition-id": job.client, "num-examples": len(job.data), **(metrics or {})})
    return Message(RecordDict({METRICS: counts, **records}), reply_to=message)


@app.query("partition")
def partition(message: Message, context: Context) -> Message:
    return _reply(message, _Job(message, context))


@app.train()
def train(message: Message, context: Context) -> Message:
    job, config = _Job(message, context), config_of(message)
    engine = FedAvg(job.scenario.model_fn, _hyperparameters(config), job.scenario.seed, CPU)
    update = engine.local_update(record_state(message.content.array_records[STATE]), job.data, job.client,
                                 int(config["round"]))
    return _reply(message, job, {"train-loss": float(update.train_loss)}, **{STATE: state_record(update.state)})


@app.query("gradient")
def forget_gradient(message: Message, context: Context) -> Message:
    # Imported here, not at the top: ``fedunlearn.unlearning`` loads every method (scikit-learn
    # among them), seconds that a deployment would pay in every ``train`` message's process.
    from fedunlearn.unlearning.krylov import flat_objective, flatten_parameters, gradient

    job = _Job(message, context)
    model = job.model(message)
    g = len(job.data) * gradient(flat_objective(model, job.data.x, job.data.y), flatten_parameters(model))
    return _reply(message, job, **{VECTOR: vector_record(g)})


@app.query("hvp")
def curvature_product(message: Message, context: Context) -> Message:
    from fedunlearn.unlearning.krylov import flat_objective, flatten_parameters, hvp_operator  # see forget_gradient

    job = _Job(message, context)
    model = job.model(message)
    curvature = _curvature_sample(job, int(config_of(message).get("hessian-batch", 0)), int(config_of(message)["round"]))
    direction = record_vector(message.content.array_records[VECTOR])
    product = hvp_operator(flat_objective(model, curvature.x, curvature.y), flatten_parameters(model))(direction)
    return _reply(message, job, **{VECTOR: vector_record(product)})


@app.query("krylov")
def local_newton_step(message: Message, context: Context) -> Message:
    """HF-KCU with the client's own curvature (Algorithm 1 lines 4–17, all at the client): g_i on
    the forget samples, k CG steps on its retained samples' Hessian (its whole data when a request
    leaves it none, line 5), the scaled step; the reply is the step and ‖g_i‖, nothing else."""
    from fedunlearn.unlearning.krylov import (conjugate_gradient, flat_objective, flatten_parameters, gradient,
                                              hvp_operator)  # see forget_gradient

    config, job = config_of(message), _Job(message, context)
    model, data = job.model(message), job.data
    own = _Job(message, context, subset="retained")
    own = own if len(own.data) else _Job(message, context, subset="all")
    curvature = _curvature_sample(own, int(config.get("hessian-batch", 0)), int(config["round"]))
    theta = flatten_parameters(model)
    g = len(data) * gradient(flat_objective(model, data.x, data.y), theta)
    operator = hvp_operator(flat_objective(model, curvature.x, curvature.y), theta, float(config["damping"]))
    v = conjugate_gradient(operator, g / int(config["n-retained"]), int(config["cg-iterations"])).solution
    scale = torch.ones_like(theta[0])
    if float(config.get("beta", 0.0)) > 0:
        v_norm = v.norm()
        scale = torch.where(v_norm > 0, torch.clamp(float(config["beta"]) * theta.norm() / v_norm, max=1.0), scale)
    return _reply(message, job, {"gradient-norm": float(g.norm())}, **{VECTOR: vector_record(scale * v)})


@app.train("fedquit")
def fedquit_round(message: Message, context: Context) -> Message:
    """FedQUIT's local update (``fedunlearn.unlearning.fedquit``): ``forget-ids`` are the client's
    forget samples, left out of its retained data; ``quit-ids``, those the quitting term applies to
    (the ones the source remembers), with the teacher's logits from the ``teacher`` model."""
    from fedunlearn.unlearning.fedquit import FedQUIT  # see forget_gradient

    config, job = config_of(message), _Job(message, context, subset="retained")
    method = FedQUIT(**json.loads(str(config["method-params"])))
    quit_ids = list(config.get("quit-ids", []))
    quitting = select(job.own, "forget", quit_ids) if quit_ids else None
    teacher = None if quitting is None else method.teacher_logits(
        job.scenario.model_from(record_state(message.content.array_records[TEACHER])), quitting)
    update = method.local_update(job.model(message), job.data, quitting, teacher, _hyperparameters(config),
                                 seed=job.scenario.seed, round_idx=int(config["round"]), client=job.client)
    return _reply(message, job, {"num-examples": update.num_samples, "train-loss": float(update.train_loss),
                                 "samples-processed": update.samples_processed},
                  **{STATE: state_record(update.state)})


@app.train("ascent")
def projected_ascent(message: Message, context: Context) -> Message:
    """Gradient ascent's step at a target client (``fedunlearn.unlearning.gradient_ascent``): the
    sent model ascended on the client's forget samples within ``radius`` of the ``reference`` model."""
    from fedunlearn.unlearning.gradient_ascent import GradientAscent  # see forget_gradient

    config, job = config_of(message), _Job(message, context, subset="forget")
    method = GradientAscent(**json.loads(str(config["method-params"])))
    update = method.ascend(job.model(message), job.data, record_state(message.content.array_records[REFERENCE]),
                           float(config["radius"]), lr=float(config["lr"]), seed=job.scenario.seed,
                           round_idx=int(config["round"]), client=job.client)
    return _reply(message, job, {"train-loss": float(update.train_loss), "steps": update.steps,
                                 "early-stopped": int(update.early_stopped)}, **{STATE: state_record(update.state)})


def _hyperparameters(config) -> TrainConfig:
    """The training's local step size, batch size and momentum, as a ``train`` message carries them."""
    return TrainConfig(rounds=1, local_epochs=int(config["local-epochs"]), lr=float(config["lr"]),
                       batch_size=int(config["batch-size"]), momentum=float(config["momentum"]))


def _curvature_sample(job: _Job, batch: int, round_idx: int) -> Tensors:
    """All of the subset, or a mini-batch of ``batch`` drawn from (seed, round, client) — the draw
    of the core's HF-KCU, so both engines estimate curvature on the same samples."""
    if batch <= 0 or batch >= len(job.data):
        return job.data
    rng = np.random.default_rng([job.scenario.seed, round_idx, job.client])
    mask = np.zeros(len(job.data), dtype=bool)
    mask[rng.choice(len(job.data), size=batch, replace=False)] = True
    return job.data.select(mask)


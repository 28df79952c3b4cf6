"""What the Flower tests share: a prepared digits-hfl workspace (params, raw data, partition — the
DVC stages' outputs, without DVC), and the in-process engine's results to compare with."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np
import torch

from fedunlearn.config import load_params
from fedunlearn.data.store import load_horizontal, partition_scenario, prepare_dataset
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.fedavg import FedAvg
from fedunlearn.unlearning import FederatedState, get_method

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "digits-hfl"
CPU = torch.device("cpu")


def prepared_workspace(root: Path) -> Path:
    """``root`` with the project's params.yaml and digits-hfl's data version prepared and partitioned."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT_ROOT / "params.yaml", root / "params.yaml")
    params = load_params(root / "params.yaml")
    prepare_dataset(params.scenario(SCENARIO).dataset, params, root, set())
    partition_scenario(SCENARIO, params, root)
    return root


def in_process(root: Path, rounds: int) -> FederatedState:
    """digits-hfl trained ``rounds`` rounds by the in-process FedAvg, from the same partition files."""
    from fedunlearn_flower.partition import Scenario

    scenario = Scenario.load(root, SCENARIO)
    config = scenario.config.train.model_copy(update={"rounds": rounds})
    partition = load_horizontal(SCENARIO, root)
    fed = FederatedState.from_partition(partition, model_fn=scenario.model_fn, state={}, train_config=config,
                                        seed=scenario.seed, device=CPU)
    fed.state = FedAvg(scenario.model_fn, config, scenario.seed, CPU).fit(fed.clients)
    return fed


def sample_batch(root: Path, client: int = 1, count: int = 10) -> ForgetSet:
    """The first ``count`` samples of ``client``: a sample request."""
    ids = load_horizontal(SCENARIO, root).clients[client].sample_ids[:count]
    return ForgetSet("sample", {client: np.asarray(ids)})


def unlearned_in_process(fed: FederatedState, forget_set: ForgetSet, method: str, **params) -> dict:
    return get_method(method, **params).unlearn(fed, forget_set).state


def max_difference(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


class LoopbackGrid:
    """A Flower ``Grid`` that hands each message to the ClientApp in this process, one node per
    client (node ID 100 + partition ID), and keeps its reply for the next pull: the ServerApp's code
    and the ClientApp's handlers, messages and records as on a federation, without starting one
    (seconds instead of the tens a SuperLink or Ray costs)."""

    def __init__(self, clients: int):
        from flwr.app import Context, RecordDict

        self.contexts = {100 + c: Context(run_id=1, node_id=100 + c, node_config={"partition-id": c},
                                          state=RecordDict(), run_config={}) for c in range(clients)}
        self.replies: dict[str, object] = {}
        self.sent: list[str] = []  # the message types, in order

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages) -> list[str]:
        from fedunlearn_flower.client_app import app

        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            message.metadata.__dict__["_src_node_id"] = 1
            self.sent.append(message.metadata.message_type)
            self.replies[message.metadata.message_id] = app(message, self.contexts[message.metadata.dst_node_id])
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids) -> list:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def unlearned_on_loopback(root: Path, out: Path, state: dict, method: str, params: dict,
                          forget_set: ForgetSet) -> tuple[dict, dict, list[str]]:
    """``state`` with ``forget_set`` forgotten by the Flower app's ``method`` on a ``LoopbackGrid``: the
    model, the ServerApp's notes and the message types it sent."""
    from fedunlearn_flower.partition import Scenario
    from fedunlearn_flower.server_app import UNLEARNED, Job, run_job

    out.mkdir(parents=True, exist_ok=True)
    torch.save(state, out / "initial.pt")
    grid = LoopbackGrid(Scenario.load(root, SCENARIO).num_clients)
    status = run_job(grid, Job(root=str(root), scenario=SCENARIO, out_dir=str(out), rounds=0,
                               state=str(out / "initial.pt"), method=method, params=params, batch=forget_set.to_dict()))
    return torch.load(out / UNLEARNED, weights_only=True), status["unlearning"], grid.sent

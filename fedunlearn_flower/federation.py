"""The server's side of the federation: which SuperNode holds which client, and one exchange of
messages at a time over Flower's ``Grid``.

Clients are named by partition ID, as in the core (client i is ``client_<i>`` of the partition),
so seeds, client sampling and the order in which updates are summed are the in-process engine's;
node IDs are Flower's and change with every SuperNode start. Every exchange waits for all of its
replies: a missing reply or a node Flower reports unavailable is ``NodeLost`` naming the client
and its node — a round without it would be a different model, not a slower one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import torch
from flwr.app import Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedunlearn.federation.fedavg import ClientUpdate
from fedunlearn.federation.local import State
from fedunlearn_flower.errors import FlowerRunFailed, NodeLost, NodeNeverConnected
from fedunlearn_flower.partition import Scenario
from fedunlearn_flower.records import METRICS, STATE, VECTOR, content, record_state, record_vector

POLL_SECONDS = 0.1  # between pulls of replies: a pull is one local gRPC call
# Flower's replies that mean the node is gone, not that its ClientApp raised.
_GONE = (ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
         ErrorCode.CLIENT_APP_CRASHED)


class Federation:
    """``grid`` with the scenario's clients on it. ``connect`` maps nodes to clients; the other
    methods send one message type to chosen clients and return their replies by client."""

    def __init__(self, grid: Grid, scenario: Scenario, root: str | Path, *, connect_timeout: float = 60.0,
                 round_timeout: float = 600.0):
        self.grid = grid
        self.scenario = scenario
        self.root = str(root)
        self.connect_timeout = connect_timeout
        self.round_timeout = round_timeout
        self.nodes: dict[int, int] = {}  # client (partition ID) → Flower node ID
        self.sizes: dict[int, int] = {}  # client → its number of training samples

    def connect(self) -> "Federation":
        """Wait for one node per client, then ask each which partition it holds."""
        expected = self.scenario.num_clients
        deadline = time.monotonic() + self.connect_timeout
        node_ids = sorted(self.grid.get_node_ids())
        while len(node_ids) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
            node_ids = sorted(self.grid.get_node_ids())
        replies = self._send({node: self._content() for node in node_ids}, "query.partition", "connect",
                             by_node=True)
        for node, reply in replies.items():
            metrics = reply.content.metric_records[METRICS]
            self.nodes[int(metrics["partition-id"])] = node
            self.sizes[int(metrics["partition-id"])] = int(metrics["num-examples"])
        missing = sorted(set(range(expected)) - set(self.nodes))
        if missing:
            raise NodeNeverConnected(
                f"client(s) {', '.join(map(str, missing))} of {self.scenario.name} never connected to the "
                f"SuperLink within {self.connect_timeout:g} s ({len(self.nodes)} of {expected} nodes joined: "
                f"clients {sorted(self.nodes)}); start a SuperNode with --node-config \"partition-id=<i>\" for each",
                missing)
        return self

    def train(self, state: State, round_idx: int, clients: Sequence[int], *, local_epochs: int, lr: float,
              batch_size: int, momentum: float, subset: str = "all",
              forget_ids: dict[int, list[str]] | None = None) -> list[ClientUpdate]:
        """One ``train`` message per client; their updates in client order (the core's summation order)."""
        forget_ids = forget_ids or {}
        hyper = {"round": round_idx, "subset": subset, "local-epochs": local_epochs, "lr": lr, "batch-size": batch_size,
                 "momentum": momentum}
        jobs = {c: {**hyper, "forget-ids": forget_ids.get(c, [])} for c in clients}
        return [update for update, _ in self.updates("train", state, jobs, f"round-{round_idx}").values()]

    def updates(self, message_type: str, state: State, jobs: dict[int, dict], group: str,
                states: dict[int, dict[str, State]] | None = None) -> dict[int, tuple[ClientUpdate, dict]]:
        """A ``train.*`` exchange: ``state`` and each client's configuration (``jobs``) and further
        models (``states``, by record name); per client, in client order (the core's summation
        order), its updated model as a ``ClientUpdate`` and the reply's metrics."""
        states = states or {}
        replies = self._send({c: self._content(state, states=states.get(c), **config) for c, config in jobs.items()},
                             message_type, group)
        updates = {}
        for c in sorted(replies):
            metrics = dict(replies[c].content.metric_records[METRICS])
            updates[c] = (ClientUpdate(c, record_state(replies[c].content.array_records[STATE]),
                                       int(metrics["num-examples"]), float(metrics["train-loss"])), metrics)
        return updates

    def vectors(self, message_type: str, state: State, jobs: dict[int, dict], group: str,
                vector: torch.Tensor | None = None) -> dict[int, tuple[torch.Tensor, dict]]:
        """A ``query.*`` exchange whose replies are vectors: per client, the vector and the reply's
        metrics (``num-examples``, the samples behind it, and what the handler adds)."""
        replies = self._send({c: self._content(state, vector, **config) for c, config in jobs.items()},
                             message_type, group)
        return {c: (record_vector(r.content.array_records[VECTOR]), dict(r.content.metric_records[METRICS]))
                for c, r in sorted(replies.items())}

    def _content(self, state: State | None = None, vector: torch.Tensor | None = None,
                 states: dict[str, State] | None = None, **config) -> RecordDict:
        return content(state, vector, states, root=self.root, scenario=self.scenario.name, **config)

    def _send(self, jobs: dict[int, RecordDict], message_type: str, group: str,
              by_node: bool = False) -> dict[int, Message]:
        """Send each job to its client's node (``by_node``: keys are node IDs) and wait for every reply."""
        node_of = (lambda k: k) if by_node else self.nodes.__getitem__
        sent = {node_of(k): k for k in jobs}
        messages = [Message(jobs[k], dst_node_id=node_of(k), message_type=message_type, group_id=group)
                    for k in jobs]
        replies = {r.metadata.src_node_id: r for r in self._exchange(messages)}
        for node, key in sent.items():
            reply = replies.get(node)
            if reply is None or (reply.has_error() and reply.error.code in _GONE):
                why = "no reply" if reply is None else reply.error.reason
                raise NodeLost(f"{message_type} ({group}): SuperNode {node} ({self._name(key, by_node)}) was lost "
                               f"mid-round: {why} within {self.round_timeout:g} s; nothing was produced from this "
                               "round — restart the node and run the same command again")
            if reply.has_error():
                raise FlowerRunFailed(f"{message_type} ({group}): the ClientApp of SuperNode {node} "
                                      f"({self._name(key, by_node)}) raised: {reply.error.reason}")
        return {key: replies[node] for node, key in sent.items()}

    def _exchange(self, messages: list[Message]) -> list[Message]:
        """``Grid.send_and_receive`` with a finer poll: Flower's sleeps 3 s between pulls, which
        at a few exchanges per unlearning request (one per CG step for HF-KCU) is most of the time."""
        pending = set(self.grid.push_messages(messages))
        replies: list[Message] = []
        deadline = time.monotonic() + self.round_timeout
        while pending and time.monotonic() < deadline:
            pulled = list(self.grid.pull_messages(pending))
            replies.extend(pulled)
            pending -= {m.metadata.reply_to_message_id for m in pulled}
            if pending:
                time.sleep(POLL_SECONDS)
        return replies

    @staticmethod
    def _name(key: int, by_node: bool) -> str:
        return "client not yet known" if by_node else f"client {key}"

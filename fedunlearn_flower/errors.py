"""The faults of a Flower run, as fedunlearn errors: the CLI's exit codes and messages apply."""

from __future__ import annotations

from fedunlearn.errors import BatchFailed, FedunlearnError


class NodeLost(BatchFailed):
    """A SuperNode stopped answering mid-round (its process died, or its reply never came): the
    round's model was not produced, so nothing downstream may be registered; a rerun starts over."""


class NodeNeverConnected(FedunlearnError):
    """A SuperNode did not join the federation within the connect timeout; ``clients`` are the
    partition IDs nobody served."""

    exit_code = 1

    def __init__(self, message: str, clients: list[int] | None = None):
        super().__init__(message)
        self.clients = list(clients or [])


class FlowerRunFailed(FedunlearnError):
    """The ServerApp or a ClientApp raised; the message carries Flower's reason."""

    exit_code = 1

"""Model states and flat vectors as Flower records, and back, bit for bit.

``ArrayRecord`` keeps each tensor's dtype, shape and bytes, and the key order of the state dict,
so a state that travels through Flower is the state that was sent: the equivalence with the
in-process engine rests on that.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedunlearn.federation.local import State

STATE = "arrays"      # the global model (server → client) or the updated model (client → server)
VECTOR = "vector"     # a flat vector: a direction (server → client), a gradient or a product (client → server)
CONFIG = "config"     # what to compute, on which subset of the client's data
METRICS = "metrics"   # num-examples and train-loss of a reply
TEACHER = "teacher"   # FedQUIT: the model at the request, the virtual teacher's source (server → target client)
REFERENCE = "reference"  # gradient ascent: w_ref, the centre of the projection ball (server → target client)


def state_record(state: State) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu() for k, v in state.items()})


def record_state(record: ArrayRecord) -> State:
    return record.to_torch_state_dict()


def vector_record(vector: torch.Tensor) -> ArrayRecord:
    return ArrayRecord({VECTOR: vector.detach().cpu()})


def record_vector(record: ArrayRecord) -> torch.Tensor:
    return record.to_torch_state_dict()[VECTOR]


def content(state: State | None = None, vector: torch.Tensor | None = None, states: dict[str, State] | None = None,
            **config) -> RecordDict:
    """A message's records: the model, a vector, further models by record name (``TEACHER``,
    ``REFERENCE``) and the configuration, those given."""
    records: dict = {CONFIG: ConfigRecord(config)}
    if state is not None:
        records[STATE] = state_record(state)
    if vector is not None:
        records[VECTOR] = vector_record(vector)
    records.update({name: state_record(extra) for name, extra in (states or {}).items()})
    return RecordDict(records)


def config_of(message: Message) -> ConfigRecord:
    return message.content.config_records.get(CONFIG, ConfigRecord())

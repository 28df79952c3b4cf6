"""What a Flower run left in its output folder, read back as the runners return it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedunlearn.federation.local import State
from fedunlearn_flower.errors import FlowerRunFailed, NodeLost, NodeNeverConnected
from fedunlearn_flower.server_app import STATUS, STEP, TRAINED, UNLEARNED, Job

# The ServerApp's errors that keep their type when they come back from its process.
_KNOWN = {cls.__name__: cls for cls in (NodeLost, NodeNeverConnected, FlowerRunFailed)}


@dataclass
class FlowerResult:
    """The models a run produced (None where the job did not ask for them), its status notes, and
    the wall time the runner measured, engine start and stop included."""

    trained: State | None
    unlearned: State | None
    step: State | None
    notes: dict = field(default_factory=dict)
    seconds: float = 0.0


def read_result(job: Job, seconds: float) -> FlowerResult:
    """The outcome ``status.json`` records; its error, raised as a fedunlearn error."""
    out = Path(job.out_dir)
    status = json.loads((out / STATUS).read_text()) if (out / STATUS).is_file() else None
    if status is None:
        raise FlowerRunFailed(f"the Flower run of {job.scenario} ended without a status ({out / STATUS} is missing): "
                              "the ServerApp did not start or was killed")
    if not status["ok"]:
        if status["error"] == NodeNeverConnected.__name__:
            raise NodeNeverConnected(status["message"], status.get("clients"))
        raise _KNOWN.get(status["error"], FlowerRunFailed)(f"{status['error']}: {status['message']}")
    return FlowerResult(_load(out / TRAINED), _load(out / UNLEARNED), _load(out / STEP), status, seconds)


def _load(path: Path) -> State | None:
    return torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None

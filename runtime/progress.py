"""Progress of the steps a user waits for — training rounds, audit references, a batch's attempts —
as the flows and tasks report it. Reporting is a no-op unless someone listens: the command line
listens and draws it (``cli.progress``); a served deployment's run, a test, a script do not.

The core knows nothing of this: its loops take an optional callback (``on_round``,
``on_reference``), which the flows turn into ``report`` calls. Listeners are called in the reporting
thread (client updates may run in a thread pool): a listener must be quick and thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Iterator


@dataclass(frozen=True)
class Step:
    """One step of a long task: ``done`` of ``total`` (``label`` names the task, ``detail`` the step:
    "round 3/20: test_acc=0.9012"). ``final``: the task ended here, though ``done`` < ``total`` (an
    escalation that stopped at its first attempt)."""

    label: str
    done: int
    total: int
    detail: str = ""
    final: bool = False

    @property
    def last(self) -> bool:
        return self.final or self.done >= self.total


Listener = Callable[[Step], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def report(label: str, done: int, total: int, detail: str = "", final: bool = False) -> None:
    """Tell every listener (none: nothing happens) that ``label`` is at ``done`` of ``total``."""
    if not _listeners:
        return
    step = Step(label, done, max(total, 1), detail, final)
    with _lock:
        for listener in list(_listeners):
            listener(step)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[Listener]:
    """``listener`` is told of every step reported until the block ends."""
    with _lock:
        _listeners.append(listener)
    try:
        yield listener
    finally:
        with _lock:
            _listeners.remove(listener)

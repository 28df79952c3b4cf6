"""What the command shows of a long step while it runs (``runtime.progress``): on a terminal one
line redrawn in place, a bar with the step's count; otherwise (a pipe, a log file) one line per
step, so that a log shows how far a run got. On stderr: what the command prints on stdout stays
as it was. ``fedunlearn --quiet`` shows none of it."""

from __future__ import annotations

import contextlib
import sys
from typing import IO, Iterator

from runtime.progress import Step, listening

BAR_WIDTH = 24


class ProgressPrinter:
    """A ``runtime.progress`` listener that draws on ``stream``: redrawn in place (``tty``) or a line a step."""

    def __init__(self, stream: IO[str], tty: bool):
        self.stream, self.tty, self.open = stream, tty, ""

    def __call__(self, step: Step) -> None:
        text = f"{step.label}: {step.detail or f'{step.done}/{step.total}'}"
        if not self.tty:
            self.stream.write(f"  … {text}\n")
        else:
            if self.open and self.open != step.label:
                self.stream.write("\n")  # another task began: the last one's line stays as it was left
            filled = BAR_WIDTH * min(step.done, step.total) // step.total
            self.stream.write(f"\r\x1b[2K  [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}")
            self.open = "" if step.last else step.label
            if step.last:
                self.stream.write("\n")
        self.stream.flush()

    def close(self) -> None:
        """A line left open (the command ended, or failed, mid-task) is ended."""
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = ""


@contextlib.contextmanager
def shown(stream: IO[str] | None = None, tty: bool | None = None) -> Iterator[ProgressPrinter]:
    """Progress drawn on ``stream`` (stderr) while the block runs; redrawn in place when ``tty``
    (None: when the stream is a terminal)."""
    stream = stream or sys.stderr
    if tty is None:
        tty = bool(getattr(stream, "isatty", lambda: False)())
    printer = ProgressPrinter(stream, tty)
    try:
        with listening(printer):
            yield printer
    finally:
        printer.close()

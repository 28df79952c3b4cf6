"""Files a user names on the command line (an ID list, a baseline, a receipt, a key) are read
with a size cap: one byte past it is enough to refuse the file, so ``/dev/zero``, a FIFO fed
forever or a mistaken multi-gigabyte path ends in one line instead of filling the memory."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from fedunlearn.errors import InputError


def describe_size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 and not limit % (1 << 20) else f"{limit} bytes"


def read_capped(path: str | Path, what: str, limit: int, advice: str, error: type[Exception] = InputError) -> bytes:
    """At most ``limit`` bytes of ``path``; ``error`` (default exit status 2) for a larger file,
    naming it, the limit and ``advice``. A file that cannot be opened is ``FileNotFoundError``."""
    try:
        with open(path, "rb") as handle:
            return read_stream(handle, str(path), what, limit, advice, error)
    except OSError as err:
        raise FileNotFoundError(f"cannot read {what} {path} ({err.strerror or err.__class__.__name__}); give the "
                                "path of a readable file") from None


def read_stream(handle: BinaryIO, name: str, what: str, limit: int, advice: str,
                error: type[Exception] = InputError) -> bytes:
    """``read_capped`` for an open stream (standard input): ``name`` is how the message calls it."""
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise error(f"{name} is larger than {describe_size(limit)}, the limit for {what}: {advice}")
    return data


def plain_note(text: str, flag: str, limit: int) -> str:
    """A note typed on the command line (a hold's reason): stripped, one line of printable characters,
    at most ``limit`` of them. An escape code would act on every terminal that later shows the note
    (status, receipts, the log), so it is refused, naming the first one, rather than kept."""
    note = text.strip()
    at = next((i for i, char in enumerate(note) if not char.isprintable()), None)
    if at is not None:
        raise InputError(f"{flag} holds a control character ({note[at]!r}, character {at + 1}): give plain text on one "
                         "line; nothing was changed")
    if len(note) > limit:
        raise InputError(f"{flag} is {len(note)} characters long, over the limit of {limit}: shorten it (a case "
                         "number and a few words); nothing was changed")
    return note

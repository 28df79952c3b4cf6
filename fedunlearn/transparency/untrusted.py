"""Reading what a data subject or a witness hands over: receipts, tree heads, keys and ID lists
are untrusted, so each is read with a size cap, as UTF-8 without control characters, and every
number and base64 field in its one canonical form. Whatever fails is ``ReceiptMalformed`` (exit
status 10) with one line naming the file and what was wrong, never a traceback.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from fedunlearn.transparency.failures import ReceiptMalformed
from fedunlearn.user_files import read_capped

# Caps well above anything this project writes (a receipt is a few kilobytes, a key one line, a
# request at most MAX_IDS_PER_REQUEST IDs), so that a hostile file is refused before it is parsed.
RECEIPT_LIMIT = 1 << 20
KEY_LIMIT = 4 << 10
IDS_LIMIT = 64 << 20
MAX_INDEX = (1 << 63) - 1  # tree sizes and indexes are uint64 in C2SP; Go's and ours stay below 2**63
NUMBER = re.compile(r"0|[1-9][0-9]{0,18}")
# Control characters a receipt never holds: everything below U+0020 but the newline, DEL, C1.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def read_limited(path: Path, what: str, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``; a larger file (``/dev/zero`` too) is malformed. A file
    that cannot be opened is ``FileNotFoundError`` (exit status 2), as before."""
    return read_capped(path, what, limit, f"it is not {what} this command reads", ReceiptMalformed)


def strict_text(data: bytes, source: str, what: str, allow_whitespace: bool = False) -> str:
    """UTF-8 with no control character but the newline (tabs and CR too with ``allow_whitespace``)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ReceiptMalformed(f"{source} is not UTF-8 text (byte {err.start}): it is not {what}; copy the file as "
                               "it was handed to you, without converting it") from None
    found = re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]" if allow_whitespace else CONTROL, text)
    if found:
        raise ReceiptMalformed(f"{source} holds the control character {found.group()!r} at character "
                               f"{found.start()} (CRLF line ends, NUL and the like): it is not {what}; copy the file "
                               "as it was handed to you")
    return text


def read_text(path: Path, what: str, limit: int, allow_whitespace: bool = False) -> str:
    return strict_text(read_limited(path, what, limit), str(path), what, allow_whitespace)


def canonical_number(text: str, source: str, what: str) -> int:
    """A decimal number without sign, leading zero or more than 19 digits, below 2**63."""
    if not isinstance(text, str) or not NUMBER.fullmatch(text) or int(text) > MAX_INDEX:
        raise ReceiptMalformed(f"{source}: {what} {_shown(text)} is not a number in canonical form (decimal digits, "
                               "no leading zero, below 2**63)")
    return int(text)


def strict_b64(text: object, source: str, what: str, size: int | None = None) -> bytes:
    """Standard base64 with its padding, in the one encoding that re-encodes to itself."""
    try:
        raw = base64.b64decode(text, validate=True) if isinstance(text, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or base64.b64encode(raw).decode() != text or (size is not None and len(raw) != size):
        length = f" of {size} bytes" if size is not None else ""
        raise ReceiptMalformed(f"{source}: {what} is not canonical base64{length} ({_shown(text)})")
    return raw


def _shown(value: object) -> str:
    """A value from an untrusted file, short and on one line, for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

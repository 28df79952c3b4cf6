"""The append-only deletion ledger (``data/ledger/ledger.jsonl``): one JSON line per applied
request. The DVC ``prepare`` stage depends on it and drops every ``sample_ids`` it lists.

Appends are idempotent by ``request_id`` (a request already in the ledger is skipped, so a
re-run after a crash never applies it twice) and durable (fsync) before they return.

A ledger that loses a line silently un-deletes: the next data version brings the line's samples
back. So every entry is chained: ``prev_hash`` is the ``checksum`` of the entry before it
(``GENESIS`` for the first), and ``checksum`` is the SHA-256 of the entry's canonical JSON with
its ``prev_hash`` (everything but the checksum itself). An edited line fails its checksum, a
removed or reordered line breaks the next one's ``prev_hash``, and a line cut off by a crash
does not parse. ``Ledger.inspect`` finds all three; it never repairs anything itself — what may
be dropped or restored is decided against the batch journals (``requests.integrity``). Lines
written before entries were chained (no checksum) are accepted only as a prefix of the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedunlearn.errors import StateDamaged
from fedunlearn.requests.folders import append_lines_durable, write_text_atomic
from fedunlearn.requests.model import DeletionRequestModel, RequestKind, utc_now

LEDGER_PATH = Path("data/ledger/ledger.jsonl")
GENESIS = "0" * 64


class LedgerEntry(BaseModel):
    """One applied request. ``sample_ids`` are the IDs this entry deletes; IDs the request
    named that an earlier request of the same batch already deletes are in ``merged_ids``."""

    model_config = ConfigDict(extra="allow")  # lines written by other tools keep their fields

    request_id: str
    batch_id: str | None = None
    scenario: str | None = None
    kind: RequestKind | None = None
    subject: dict[str, Any] = Field(default_factory=dict)
    sample_ids: list[str]
    clients: dict[str, list[str]] = Field(default_factory=dict, description="HFL/DFL: client -> IDs")
    held_out: list[str] = Field(default_factory=list, description="IDs of the held-out test split")
    merged_ids: list[str] = Field(default_factory=list)
    submitted_at: datetime | None = None
    deadline: datetime | None = Field(None, description="the deadline the request named (None: deadline_days after "
                                                        "submitted_at)")
    applied_at: datetime | None = None
    prev_hash: str | None = Field(None, description="checksum of the entry before this one (GENESIS for the first)")
    checksum: str | None = Field(None, description="SHA-256 of this entry's canonical JSON, prev_hash included")

    def matches(self, request: DeletionRequestModel) -> bool:
        """The same request (kind, scenario, subject), e.g. its file seen again after a crash."""
        return (self.kind, self.scenario, self.subject) == (request.kind, request.scenario, request.subject)

    def due(self, deadline_days: float, submitted_fallback: datetime) -> datetime:
        """When the request must be forgotten (exactly) by: the deadline it named, else ``deadline_days``
        after its submission (``submitted_fallback`` for entries written without one)."""
        return self.deadline or (self.submitted_at or submitted_fallback) + timedelta(days=deadline_days)

    def chained(self, prev_hash: str, applied_at: datetime) -> "LedgerEntry":
        """This entry as it is appended after ``prev_hash``: stamped, linked and checksummed."""
        linked = self.model_copy(update={"applied_at": applied_at, "prev_hash": prev_hash, "checksum": None})
        return linked.model_copy(update={"checksum": content_checksum(linked.document())})

    def document(self) -> dict[str, Any]:
        """The JSON object of the ledger line."""
        return self.model_dump(mode="json", exclude_none=True)

    def line(self) -> str:
        return json.dumps(self.document(), ensure_ascii=False, sort_keys=True)


def content_checksum(document: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a ledger line without its ``checksum`` field."""
    content = {key: value for key, value in document.items() if key != "checksum"}
    canonical = json.dumps(content, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass
class LedgerProblem:
    """One way the ledger file is damaged, by 1-based line number."""

    line: int
    kind: str  # "torn tail" | "unreadable" | "checksum mismatch" | "chain broken" | "unchained after chained"
    detail: str
    request_id: str | None = None

    def __str__(self) -> str:
        who = f" (request {self.request_id})" if self.request_id else ""
        where = f"line {self.line}{who}" if self.line else (f"request {self.request_id}" if self.request_id else "")
        return f"{where + ': ' if where else ''}{self.kind}: {self.detail}"


@dataclass
class LedgerInspection:
    """What the file holds: the entries that read back intact, in order, and every problem."""

    entries: list[LedgerEntry] = field(default_factory=list)
    problems: list[LedgerProblem] = field(default_factory=list)
    torn_tail: bytes = b""  # the bytes after the last newline, when they are not a whole entry
    missing_final_newline: bool = False  # the last line is a whole, valid entry without its newline
    legacy_entries: int = 0  # lines written before entries were chained

    @property
    def intact(self) -> bool:
        return not self.problems

    @property
    def head(self) -> str:
        """The checksum a new entry links to."""
        for entry in reversed(self.entries):
            if entry.checksum:
                return entry.checksum
        return GENESIS


@dataclass(frozen=True)
class _Checked:
    """An intact inspection of a file's first ``length`` bytes (``lines`` lines, the last
    checksum ``previous``), to carry on from when the file only grew."""

    digest: bytes
    length: int
    lines: int
    previous: str | None
    inspection: LedgerInspection


_CHECKED: dict[str, _Checked] = {}  # per ledger path, in this process


class Ledger:
    def __init__(self, path: Path):
        self.path = Path(path)

    def inspect(self) -> LedgerInspection:
        """Read every line and check its checksum and link; never changes the file. A file that
        only grew since an intact inspection in this process (its first bytes hash as before) is
        checked from where that one ended: a batch inspects the ledger several times, and a ledger
        of every deletion ever made would otherwise be parsed again each time."""
        found = LedgerInspection()
        if not self.path.is_file():
            return found
        data = self.path.read_bytes()
        key = str(self.path.resolve())
        start, numbered, previous = 0, 0, None  # previous: the last checksum seen; None in the legacy prefix
        checked = _CHECKED.get(key)
        if checked is not None and len(data) >= checked.length and \
                hashlib.sha256(data[:checked.length]).digest() == checked.digest:
            found = LedgerInspection(entries=list(checked.inspection.entries),
                                     legacy_entries=checked.inspection.legacy_entries)
            start, numbered, previous = checked.length, checked.lines, checked.previous
        lines = data[start:].split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        unreadable_before = False  # the line before could not be read: its checksum is unknown
        for number, raw in enumerate(lines + ([tail] if tail else []), start=numbered + 1):
            is_tail = bool(tail) and number == numbered + len(lines) + 1
            if not raw.strip():
                continue
            try:
                document = json.loads(raw)
                entry = LedgerEntry.model_validate(document)
            except (ValueError, ValidationError) as err:
                _note_unreadable(found, number, raw, err, is_tail)
                unreadable_before = True
                continue
            if entry.checksum is None:
                if previous is not None:
                    found.problems.append(LedgerProblem(number, "unchained after chained", "an entry without a "
                                                        "checksum after chained entries", entry.request_id))
                found.legacy_entries += 1
            elif entry.checksum != content_checksum(document):
                found.problems.append(LedgerProblem(number, "checksum mismatch", "the line was changed after it "
                                                    "was written", entry.request_id))
                previous, unreadable_before = entry.checksum, False  # the next line links to what this one claims
                continue
            elif entry.prev_hash != (previous or GENESIS) and not unreadable_before:
                found.problems.append(LedgerProblem(number, "chain broken", "the entry before it is missing or "
                                                    "was replaced (an entry was removed or lines reordered)",
                                                    entry.request_id))
            if entry.checksum is not None:
                previous = entry.checksum
            unreadable_before = False
            found.missing_final_newline = is_tail
            found.entries.append(entry)
        if found.intact and not found.missing_final_newline:  # whole lines only: a later append continues it
            _CHECKED[key] = _Checked(hashlib.sha256(data).digest(), len(data), numbered + len(lines), previous,
                                     LedgerInspection(entries=list(found.entries),
                                                      legacy_entries=found.legacy_entries))
        return found

    def entries(self) -> list[LedgerEntry]:
        """The entries of an intact ledger; a damaged one raises ``LedgerDamaged``."""
        inspection = self.inspect()
        if not inspection.intact:
            raise LedgerDamaged(self.path, inspection.problems)
        return inspection.entries

    def by_request(self) -> dict[str, LedgerEntry]:
        return {entry.request_id: entry for entry in self.entries()}

    def deleted_ids(self) -> set[str]:
        return {i for entry in self.entries() for i in entry.sample_ids}

    def append(self, entries: list[LedgerEntry]) -> list[LedgerEntry]:
        """Append the entries whose request is not in the ledger yet, chained to the last entry;
        returns those appended (as written). Callers hold the batch lock."""
        inspection = self.inspect()
        if not inspection.intact:
            raise LedgerDamaged(self.path, inspection.problems)
        present = {entry.request_id for entry in inspection.entries}
        applied_at, head, new = utc_now(), inspection.head, []
        for entry in entries:
            if entry.request_id not in present:
                new.append(entry.chained(head, applied_at))
                head = new[-1].checksum
        if new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lines = [entry.line() for entry in new]
            if inspection.missing_final_newline:  # the last entry is whole; only its newline was lost
                lines[0] = "\n" + lines[0]
            append_lines_durable(self.path, lines)
        return new

    def rewrite(self, entries: list[LedgerEntry]) -> Path:
        """Replace the file with ``entries`` (each line as written), keeping the old file beside
        it as ``ledger.jsonl.bak-<UTC time>``. For ``fedunlearn ledger repair`` only."""
        backup = self.path.with_name(f"{self.path.name}.bak-{utc_now():%Y%m%dT%H%M%S%fZ}")
        if self.path.is_file():
            backup.write_bytes(self.path.read_bytes())
        write_text_atomic(self.path, "".join(entry.line() + "\n" for entry in entries))
        return backup


def _note_unreadable(found: LedgerInspection, number: int, raw: bytes, err: Exception, is_tail: bool) -> None:
    """A line that is no ledger entry: the last one is a torn append, any other one unreadable."""
    if is_tail:
        found.torn_tail = raw
        found.problems.append(LedgerProblem(number, "torn tail", "the last line is incomplete (an append cut off "
                                            "by a crash or a truncation)", _request_id_in(raw)))
    else:
        found.problems.append(LedgerProblem(number, "unreadable", f"not a ledger entry: {err}", _request_id_in(raw)))


def _request_id_in(raw: bytes) -> str | None:
    """The request ID a damaged line still shows, if it got that far."""
    return field_in(raw, "request_id")


def field_in(raw: bytes, key: str) -> str | None:
    """The string value of ``key`` that a damaged line still shows whole, if it got that far."""
    text = raw.decode("utf-8", errors="replace")
    start = text.find(f'"{key}"')
    if start < 0:
        return None
    rest = text[start + len(key) + 2:].lstrip(" :")
    if not rest.startswith('"'):
        return None
    end = rest.find('"', 1)
    return rest[1:end] if end > 0 else None


class LedgerDamaged(StateDamaged):
    """The ledger file does not read back as the chain that was written; nothing was changed."""

    def __init__(self, path: Path, problems: list[LedgerProblem], detail: str = ""):
        self.path, self.problems = Path(path), problems
        listing = "; ".join(str(p) for p in problems)
        super().__init__(f"the deletion ledger {path} is damaged ({listing}){detail}. Nothing was changed: a damaged "
                         "ledger could bring deleted samples back. Run `fedunlearn ledger verify` for the details and "
                         "`fedunlearn ledger repair` to restore the entries from the batch records "
                         "(data/deletion_requests/batches/), the receipts and the processed request files")


def read_deleted_ids(path: Path) -> set[str]:
    """Sample IDs the ledger at ``path`` deletes (the ``prepare`` stage's input); a damaged
    ledger stops the stage rather than reproduce data without some deletions."""
    return Ledger(path).deleted_ids()

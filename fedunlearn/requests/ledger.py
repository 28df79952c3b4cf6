"""The append-only deletion ledger (``data/ledger/ledger.jsonl``): one JSON line per applied
request. The DVC ``prepare`` stage depends on it and drops every ``sample_ids`` it lists.

Appends are idempotent by ``request_id`` (a request already in the ledger is skipped, so a
re-run after a crash never applies it twice) and durable (fsync) before they return.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.data.store import deleted_ids
from fedunlearn.requests.folders import append_lines_durable
from fedunlearn.requests.model import DeletionRequestModel, RequestKind, utc_now


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
    applied_at: datetime | None = None

    def matches(self, request: DeletionRequestModel) -> bool:
        """The same request (kind, scenario, subject), e.g. its file seen again after a crash."""
        return (self.kind, self.scenario, self.subject) == (request.kind, request.scenario, request.subject)


class Ledger:
    def __init__(self, path: Path):
        self.path = Path(path)

    def entries(self) -> list[LedgerEntry]:
        if not self.path.is_file():
            return []
        return [LedgerEntry.model_validate_json(line) for line in self.path.read_text().splitlines() if line.strip()]

    def by_request(self) -> dict[str, LedgerEntry]:
        return {entry.request_id: entry for entry in self.entries()}

    def deleted_ids(self) -> set[str]:
        return deleted_ids(self.path)

    def append(self, entries: list[LedgerEntry]) -> list[LedgerEntry]:
        """Append the entries whose request is not in the ledger yet; returns those appended."""
        present = set(self.by_request())
        applied_at = utc_now()
        new = [entry.model_copy(update={"applied_at": applied_at}) for entry in entries
               if entry.request_id not in present]
        if new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            append_lines_durable(self.path, [entry.model_dump_json(exclude_none=True) for entry in new])
        return new

    def repair_torn_tail(self) -> bool:
        """Drop a last line without its newline: the trace of an append cut off by a crash
        (that append never returned, so its batch re-appends it). Run under the batch lock."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return False
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return False
        with open(self.path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)
            os.fsync(handle.fileno())
        return True

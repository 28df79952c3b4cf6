"""Where requests live on disk, the lock that serializes batches, and durable file operations.

    data/deletion_requests/inbox/        pending request files (<request_id>.json)
                          /processed/    applied requests
                          /quarantine/   rejected files, each with <name>.reason.txt beside it
                          /batches/      one record per batch (<batch_id>.json), also the journal
                          /.staging/     request files being written (then moved into the inbox)
                          /.lock         held while a batch runs
                          /.lock-holder.json  who holds (or last held) it, and the batch it formed: a note

Every write that matters is made durable (fsync of the file and of its directory) and every
move is an ``os.replace`` within one filesystem, so a crash leaves each file either before or
after the step, never half-way.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

from fedunlearn.errors import BatchInProgress

REQUESTS_DIR = Path("data/deletion_requests")
RECEIPTS_DIR = Path("data/receipts")  # fedunlearn.receipts: here, so that the ledger checks can read them
LOCK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RequestFolders:
    workspace: Path

    @classmethod
    def create(cls, workspace: Path) -> "RequestFolders":
        folders = cls(Path(workspace))
        for directory in (folders.inbox, folders.processed, folders.quarantine, folders.batches, folders.staging):
            directory.mkdir(parents=True, exist_ok=True)
        return folders

    @property
    def base(self) -> Path:
        return self.workspace / REQUESTS_DIR

    @property
    def inbox(self) -> Path:
        return self.base / "inbox"

    @property
    def processed(self) -> Path:
        return self.base / "processed"

    @property
    def quarantine(self) -> Path:
        return self.base / "quarantine"

    @property
    def batches(self) -> Path:
        return self.base / "batches"

    @property
    def staging(self) -> Path:
        return self.base / ".staging"

    @property
    def lock(self) -> Path:
        return self.base / ".lock"


@dataclass
class LockHeld:
    """The batch lock as its holder took it: whether it had to wait (``waited``), and what the holder
    before it noted (``previous``: its command and the batch it formed, if any) — after a wait, the
    run that was waited for. Each holder notes itself in ``.lock-holder.json`` beside the lock, a
    batch-forming one its batch too (``note_batch``): a note only, never a decision's input (a torn
    or missing one reads as none)."""

    folders: RequestFolders
    command: str
    waited: bool = False
    previous: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return self.folders.base / ".lock-holder.json"

    def note_batch(self, batch_id: str, scenario: str) -> None:
        self._write({"command": self.command, "batch_id": batch_id, "scenario": scenario})

    def _read(self) -> dict[str, Any] | None:
        try:
            found = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def _write(self, note: dict[str, Any]) -> None:
        try:
            self.path.write_text(json.dumps(note))
        except OSError:
            pass  # a full disk must not stop a batch for a note


@contextmanager
def batch_lock(folders: RequestFolders, timeout: float = LOCK_TIMEOUT_S,
               rerun: str = "fedunlearn ingest") -> Iterator[LockHeld]:
    """Hold the batch lock: a second batch waits up to ``timeout`` seconds, then fails clearly,
    naming the command (``rerun``) to run once the first is done. The lock is an OS file lock,
    released by the kernel if the holder dies."""
    lock, held = FileLock(folders.lock, timeout=timeout, thread_local=False), LockHeld(folders, rerun)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            held.waited = True
            lock.acquire()
    except Timeout:
        raise BatchInProgress(f"another deletion batch is running in {folders.workspace} (it has held "
                              f"{folders.lock} for more than {timeout:.0f} s); wait for it to finish, then run "
                              f"`{rerun}` again") from None
    try:
        held.previous = held._read()
        held._write({"command": rerun, "batch_id": None})
        yield held
    finally:
        lock.release()


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` all at once: readers see the old or the new file."""
    temporary = path.with_name(f".{path.name}.tmp")
    _write_synced(temporary, text)
    os.replace(temporary, path)
    fsync_directory(path.parent)


def write_json_atomic(path: Path, document: Any) -> None:
    write_text_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n")


def append_lines_durable(path: Path, lines: list[str]) -> None:
    """Append whole lines in one write and fsync before returning."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
        handle.flush()
        os.fsync(handle.fileno())


def free_name(directory: Path, name: str) -> str:
    """``name``, or ``<stem>-<n><suffix>`` when it is taken: a move never overwrites a file."""
    candidate, n = name, 0
    stem, dot, suffix = name.partition(".")
    while os.path.lexists(directory / candidate):
        n += 1
        candidate = f"{stem}-{n}{dot}{suffix}"
    return candidate


def move_into(source: Path, directory: Path, name: str | None = None) -> Path:
    """Move ``source`` (a file, or a symlink itself, never its target) into ``directory``.
    Callers hold the batch lock, so the free name cannot be taken in between."""
    target = directory / free_name(directory, name or source.name)
    os.replace(source, target)
    fsync_directory(directory)
    fsync_directory(source.parent)
    return target


def place_new_file(staged: Path, directory: Path, name: str) -> Path:
    """Publish a fully written file under a free name without overwriting anything, even when a
    concurrent writer picks the same name (a hard link fails if the name exists)."""
    while True:
        target = directory / free_name(directory, name)
        try:
            os.link(staged, target, follow_symlinks=False)
        except FileExistsError:
            continue
        os.unlink(staged)
        fsync_directory(directory)
        return target

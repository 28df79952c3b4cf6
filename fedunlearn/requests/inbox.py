"""The inbox: reading request files safely, submitting new ones, and filing each one into
exactly one of ``processed/`` or ``quarantine/``.

Only regular files directly inside ``inbox/`` with a safe name are read. Anything else (a
symlink, a directory, a hidden file, a name with ``..`` or odd characters, another suffix) is
never followed or opened: it becomes an item with a ``problem``, which the batch quarantines.
Files are opened with ``O_NOFOLLOW`` and read up to the size limit; nothing is unpickled.

A file that does not parse yet (empty, malformed JSON) and was modified less than
``grace_seconds`` ago is taken to be still being written: it stays in the inbox for the next
run (``InboxItem.waiting``) rather than going to quarantine, where a completed request would
never be applied. Other writers should write elsewhere and rename into the inbox, as
``submit_request`` does: a rename is atomic, so the inbox only ever sees whole files.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fedunlearn.requests.folders import RequestFolders, free_name, move_into, place_new_file, write_text_atomic
from fedunlearn.requests.model import (MAX_REQUEST_BYTES, REQUEST_ID_PATTERN, DeletionRequestModel,
                                       IncompleteRequest, RequestError, parse_request, utc_now)

SAFE_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.json$")
REASON_SUFFIX = ".reason.txt"
REASON_FILE_BYTES = 64 * 1024  # what `quarantine` writes is a few lines


@dataclass
class InboxItem:
    """One entry of the inbox: a parsed request, or the problem that prevents it."""

    name: str
    path: Path
    request: DeletionRequestModel | None = None
    problem: str | None = None
    waiting: str | None = None  # does not parse yet and is young: left for the next run, with why


def unsafe_name_problem(name: str) -> str | None:
    if name.startswith("."):
        return "hidden file (name starts with '.'): not read"
    if ".." in name:
        return "file name contains '..': not read"
    if not name.endswith(".json"):
        return "not a .json file: request files are named <request_id>.json"
    if not SAFE_FILE_NAME.match(name):
        return ("file name must be 1-128 characters from A-Z a-z 0-9 . _ - (starting with a letter or digit) "
                "followed by .json")
    return None


def scan_inbox(folders: RequestFolders, scenario: str, grace_seconds: float = 0.0) -> list[InboxItem]:
    """Every entry of the inbox, in name order; ``scenario`` fills requests that name none; a file
    that does not parse and changed within ``grace_seconds`` is left waiting."""
    with os.scandir(folders.inbox) as entries:
        return [_read_entry(entry, scenario, grace_seconds) for entry in sorted(entries, key=lambda e: e.name)]


def _read_entry(entry: os.DirEntry, scenario: str, grace_seconds: float) -> InboxItem:
    item = InboxItem(entry.name, Path(entry.path))
    if entry.is_symlink():
        item.problem = "symbolic link: not followed; put the request file itself into the inbox"
    elif not entry.is_file(follow_symlinks=False):
        item.problem = "not a regular file (a directory or a device): only request files are read"
    else:
        item.problem = unsafe_name_problem(entry.name)
    if item.problem is None:
        modified = None
        try:
            data, modified = _read_limited(item.path)
            item.request = parse_request(data, {"request_id": entry.name.removesuffix(".json"),
                                                "scenario": scenario, "submitted_at": modified})
        except IncompleteRequest as err:
            age = (utc_now() - modified).total_seconds() if modified else float("inf")
            if age < grace_seconds:
                item.waiting = (f"{err}, and the file changed {age:.0f} s ago: taken to be still being written, it "
                                f"is read again by the next run (quarantined if still unreadable after "
                                f"{grace_seconds:.0f} s)")
            else:
                item.problem = str(err)
        except RequestError as err:
            item.problem = str(err)
    return item


def _read_limited(path: Path) -> tuple[bytes, datetime]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise RequestError(f"cannot open the file: {err.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise RequestError("not a regular file: only request files are read")
        # One byte past the limit is enough to tell "too large" without reading a huge file.
        data = handle.read(MAX_REQUEST_BYTES + 1)
    return data, datetime.fromtimestamp(status.st_mtime, timezone.utc)


def submit_request(folders: RequestFolders, request: DeletionRequestModel) -> Path:
    """Write ``request`` as ``inbox/<request_id>.json``. It is written in ``.staging/`` first, so
    an ingest running meanwhile never sees half a file."""
    staged = folders.staging / f"{request.request_id}.{os.getpid()}.json"
    write_text_atomic(staged, request.to_json())
    return place_new_file(staged, folders.inbox, f"{request.request_id}.json")


def file_processed(folders: RequestFolders, item: InboxItem) -> Path:
    return move_into(item.path, folders.processed)


def quarantine_name(name: str) -> str:
    """A safe name for the quarantined copy; the original name stays in the reason file."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).replace("..", "_").lstrip("._-")[:128]
    return cleaned or "unnamed"


def quarantine(folders: RequestFolders, item: InboxItem, reason: str) -> Path:
    """Move the entry into ``quarantine/`` with ``<name>.reason.txt`` beside it. The reason is
    written first: a crash in between leaves the file in the inbox, to be quarantined again."""
    target_name = free_name(folders.quarantine, quarantine_name(item.name))
    request_id = item.request.request_id if item.request else "(unknown: the file could not be read as a request)"
    write_text_atomic(folders.quarantine / f"{target_name}{REASON_SUFFIX}",
                      f"file: {item.name!r}\n"
                      f"request_id: {request_id}\n"
                      f"quarantined_at: {utc_now().isoformat()}\n"
                      f"reason: {reason}\n"
                      "what to do: fix the request and put it into data/deletion_requests/inbox/ again, "
                      "or submit it with `fedunlearn request ...`\n")
    return move_into(item.path, folders.quarantine, target_name)


@dataclass(frozen=True)
class Quarantined:
    """A file in ``quarantine/`` as its reason file describes it (read back, nothing moved)."""

    name: str  # the quarantined entry's (safe) name in quarantine/
    request_id: str | None  # None: the file could not be read as a request
    at: datetime | None
    reason: str


def read_quarantined(folders: RequestFolders) -> list[Quarantined]:
    """Every quarantined entry with its reason, the latest first. A reason file that does not read as
    ``quarantine`` writes one keeps its entry listed, with that said as its reason."""
    try:
        names = set(os.listdir(folders.quarantine))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        entry = name.removesuffix(REASON_SUFFIX)
        if entry != name and entry in names:
            found.append(_read_reason(folders.quarantine / name, entry))
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(found, key=lambda q: (q.at or oldest, q.name), reverse=True)


def _read_reason(path: Path, entry: str) -> Quarantined:
    try:
        text = _read_regular(path, REASON_FILE_BYTES).decode("utf-8", errors="replace")
    except (OSError, RequestError) as err:
        why = err.strerror if isinstance(err, OSError) else err
        return Quarantined(entry, None, None, f"its reason file cannot be read ({why})")
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    request_id = fields.get("request_id")
    try:
        at = datetime.fromisoformat(fields.get("quarantined_at", ""))
    except ValueError:
        at = None
    return Quarantined(entry, request_id if request_id and REQUEST_ID_PATTERN.match(request_id) else None,
                       at if at is None or at.tzinfo else at.replace(tzinfo=timezone.utc),
                       fields.get("reason", "its reason file names none"))


def _read_regular(path: Path, limit: int) -> bytes:
    """Up to ``limit`` bytes of a regular file; anything else in quarantine/ (a link, a FIFO, a device:
    inputs are quarantined as they came) is refused unopened, since reading it could block or never end."""
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise RequestError("not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise RequestError("not a regular file")
        return handle.read(limit)


def quarantined_sample_ids(folders: RequestFolders, name: str) -> list[str]:
    """The sample IDs the quarantined request ``name`` names (read only if a regular file, size-limited);
    none when it is not a sample request or does not parse."""
    try:
        data = _read_regular(folders.quarantine / name, MAX_REQUEST_BYTES + 1)
        request = parse_request(data, {"request_id": "quarantined", "scenario": "quarantined"})
    except (OSError, RequestError):
        return []
    return list(request.sample_ids or [])

"""The errors a user can meet, one class per meaning, each with its exit status.

Every message names what failed (the file, model version or batch) and the command that fixes it.
The CLI prints ``error: <message>`` and exits with the class's ``exit_code``:

    1  BatchFailed        a step of a journaled batch failed; running the same command again resumes it
    2  InputError         bad input or configuration (a request, a flag, params.yaml); nothing was changed
    3  BatchInProgress    another deletion batch holds the workspace's lock; its requests wait
    4  StateDamaged       a store does not read back as written (ledger, batch record, model artifact); the
                          message says what the batch already changed (nothing, or the data but not the model)
    5  BatchCannotSucceed the batch can never produce a model (e.g. it deletes every training sample)
    6  ErasureNotVerified the deleted rows' bytes are still in a store that the scan covers
    7  NoSpace            no space left on device; free space and run the same command again to resume
    8  BenchmarkRegressed `benchmark --compare`: the run succeeded, but a method got worse than the baseline
    9  RequestOverdue     `fedunlearn status`: a request is not exactly forgotten by its deadline (the status is printed)
   10  ReceiptMalformed   `verify-receipt`: a file is not a receipt, tree head or key it reads (fedunlearn.transparency)
   11  SignatureInvalid   `verify-receipt`: the tree head is not signed by the key given (or not the --key-id pinned)
   12  NotIncluded        `verify-receipt`: the entry is not in the log the signed tree head commits to
   13  LogInconsistent    `verify-receipt --since`, `ledger prove-consistency`: the log was rewritten since OLD
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator


class FedunlearnError(RuntimeError):
    """Base class; ``exit_code`` is the CLI's exit status for it."""

    exit_code = 1


class BatchFailed(FedunlearnError):
    """A step after the batch was journaled failed; the message says how to resume."""

    exit_code = 1


class InputError(FedunlearnError, ValueError):
    """Bad input or configuration; nothing was changed."""

    exit_code = 2


class DataNotPrepared(InputError, FileNotFoundError):
    """A scenario's data was never prepared in this workspace (also a ``FileNotFoundError``, as the
    missing partition was reported before)."""


class BatchInProgress(FedunlearnError):
    """Another deletion batch holds the lock."""

    exit_code = 3


class StateDamaged(FedunlearnError):
    """A store does not read back as it was written. Nothing was changed by the command, unless the
    message says what a batch had applied before the failure (its data, not yet its model)."""

    exit_code = 4


class BatchCannotSucceed(FedunlearnError):
    """Running the batch again would fail the same way: it says what must change instead."""

    exit_code = 5


class ErasureNotVerified(FedunlearnError):
    """A scanned store still holds the bytes of a deleted row."""

    exit_code = 6


class NoSpace(FedunlearnError):
    """The disk is full."""

    exit_code = 7


class BenchmarkRegressed(FedunlearnError):
    """A benchmark compared with a stored baseline found a method worse than before."""

    exit_code = 8


class RequestOverdue(FedunlearnError):
    """A deletion request is not exactly forgotten past its deadline (pending, or forgotten only on
    the interim tier): a monitor alerts on this status."""

    exit_code = 9


class ReceiptMalformed(FedunlearnError):
    """A receipt, tree head or key that does not read as one (fedunlearn.transparency)."""

    exit_code = 10


class SignatureInvalid(FedunlearnError):
    """A tree head not signed by the log's key given."""

    exit_code = 11


class NotIncluded(FedunlearnError):
    """An entry (or statement, or sample IDs) not in the log the signed tree head commits to."""

    exit_code = 12


class LogInconsistent(FedunlearnError):
    """A newer tree head that does not extend an older one: the log was rewritten."""

    exit_code = 13


EXIT_CODES = {cls.__name__: cls.exit_code for cls in (BatchFailed, InputError, BatchInProgress, StateDamaged,
                                                       BatchCannotSucceed, ErasureNotVerified, NoSpace,
                                                       BenchmarkRegressed, RequestOverdue, ReceiptMalformed,
                                                       SignatureInvalid, NotIncluded, LogInconsistent)}


# A full disk does not always say so. These texts are what a full disk raises without errno 28:
# torch's zip writer ("unexpected pos", "PytorchStreamWriter failed ..."), SQLite's SQLITE_FULL, numpy's
# short write; each counts only when a filesystem the command writes to is indeed (almost) full. An
# HTTP 500 from the Prefect server likewise: its database is on one of those filesystems.
SUSPECT_TEXTS = ("unexpected pos", "pytorchstreamwriter failed", "file write failed", "database or disk is full",
                 "requested and", "iostream error")
CERTAIN_TEXTS = ("no space left on device", "[errno 28]", "enospc")
# Below this much free space a filesystem counts as full: the write that failed was larger than what is left.
LOW_SPACE_BYTES = 16 * 2**20

# Where this process writes (the workspace, Prefect's home, the temporary directory): a full-disk
# suspect is confirmed against these filesystems (``watch_filesystems``).
_WATCHED: list[Path] = []


def watch_filesystems(*paths: str | os.PathLike) -> None:
    """Add ``paths`` to the places whose filesystems a suspected full disk is checked against."""
    for path in paths:
        if path and Path(path) not in _WATCHED:
            _WATCHED.append(Path(path))


def free_bytes(path: Path) -> int | None:
    """Free space on the filesystem of ``path`` (its nearest existing ancestor); None if unknown."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def mount_point(path: Path) -> Path:
    """The directory where the filesystem holding ``path`` is mounted."""
    path = next((p for p in (path.absolute(), *path.absolute().parents) if p.exists()), Path("/"))
    while path != path.parent and os.stat(path).st_dev == os.stat(path.parent).st_dev:
        path = path.parent
    return path


def _environment_paths() -> list[Path]:
    paths = [Path(os.environ[name]) for name in ("PREFECT_HOME", "TMPDIR") if os.environ.get(name)]
    for name in ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
        url = os.environ.get(name, "")
        if url.startswith("sqlite") and ":///" in url:
            paths.append(Path(url.split(":///", 1)[1]))
    return paths + [Path(tempfile.gettempdir())]


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err`` and every error behind it: both its ``__cause__`` and its ``__context__`` (an error raised
    while handling another — Prefect's HTTP 500 while it records a failed flow run — hides the first in
    its context, its own cause elsewhere) and the members of an exception group."""
    pending, seen = [err], set()
    while pending:
        err = pending.pop(0)
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        pending += [err.__cause__, err.__context__, *(err.exceptions if isinstance(err, BaseExceptionGroup) else ())]


def causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and every error behind it (``_chain``): for callers that look for a cause of their own."""
    return _chain(err)


def _kind(err: BaseException) -> str | None:
    """``certain`` for ENOSPC itself, ``suspect`` for what a full disk may be behind, else None."""
    if isinstance(err, NoSpace) or isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return "certain"
    text = str(err).lower()
    if any(t in text for t in CERTAIN_TEXTS):
        return "certain"
    try:
        status = getattr(getattr(err, "response", None), "status_code", None)
    except Exception:  # a ``response`` property that raises when unset (httpx's request errors)
        status = None
    if status == 500 or any(t in text for t in SUSPECT_TEXTS):
        return "suspect"
    return None


def _full_filesystem(paths: Iterable[Path]) -> str | None:
    for path in paths:
        free = free_bytes(Path(path))
        if free is not None and free < LOW_SPACE_BYTES:
            return f"{path}: the filesystem mounted at {mount_point(Path(path))} has {free / 2**20:.1f} MiB free"
    return None


def no_space_path(err: BaseException, *paths: str | os.PathLike) -> str | None:
    """Where a full disk is behind ``err`` or any error in its chain (``__cause__``/``__context__``):
    the file that could not be written, or the full filesystem among ``paths``, the watched places and
    the environment's (Prefect's home and database, the temporary directory); None if no full disk is."""
    chain = list(_chain(err))
    kinds = [_kind(e) for e in chain]
    if not any(kinds):
        return None
    named = [Path(name) for e in chain if isinstance(e, OSError) for name in (e.filename, e.filename2)
             if isinstance(name, (str, os.PathLike))]
    full = _full_filesystem([*named, *map(Path, paths), *_WATCHED, *_environment_paths()])
    if "certain" not in kinds and full is None:
        return None  # a suspect text with room on every disk: some other failure
    if named:
        return f"{named[0]}" + (f"; {full}" if full and not full.startswith(f"{named[0]}:") else "")
    return full or str(next(iter([*paths, *_WATCHED]), "a filesystem this command writes to"))


def is_no_space(err: BaseException) -> bool:
    """Whether ``err`` or an error it was raised from is a full disk (``no_space_path``)."""
    return no_space_path(err) is not None


def as_no_space(err: BaseException, resume: str, *paths: str | os.PathLike) -> NoSpace | None:
    """``err`` as the ``NoSpace`` to report: the one in its chain (it already names the path and how
    to resume), or a new one naming the path (``no_space_path``) and the command ``resume``; None if no
    full disk is behind ``err``."""
    site = no_space_path(err, *paths)
    if site is None:
        return None
    found = next((e for e in _chain(err) if isinstance(e, NoSpace)), None)
    if found is not None:
        below = [e for e in (found.__cause__, found.__context__) if e is not None]
        where = no_space_path(below[0], *paths) if below else None
        # A message that names no path (or not this one) gets the one its cause names.
        return found if where is None or where.split(";")[0] in str(found) else NoSpace(f"{found} (at {where})")
    return NoSpace(f"no space left on device ({site}); free space on that filesystem and run {resume} again: a "
                   "deletion batch resumes where it stopped")

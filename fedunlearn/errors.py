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
    9  RequestOverdue     `fedunlearn status`: a pending request is past its deadline (the status is printed)
"""

from __future__ import annotations

import errno


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
    """A deletion request is still pending past its deadline: a monitor alerts on this status."""

    exit_code = 9


EXIT_CODES = {cls.__name__: cls.exit_code for cls in (BatchFailed, InputError, BatchInProgress, StateDamaged,
                                                       BatchCannotSucceed, ErasureNotVerified, NoSpace,
                                                       BenchmarkRegressed, RequestOverdue)}


def is_no_space(err: BaseException) -> bool:
    """Whether ``err`` or an error it was raised from is ENOSPC (no space left on device)."""
    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC or isinstance(err, NoSpace):
            return True
        err = err.__cause__ or err.__context__
    return False

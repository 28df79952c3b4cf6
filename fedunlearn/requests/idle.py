"""Whether ``fedunlearn process`` has nothing at all to do for a scenario, told from the workspace's
files alone — before Prefect, MLflow and torch are imported and a Prefect server is started, which
is where a run with nothing pending spends its seconds.

Nothing to do means, with the batch lock free (taken without waiting, for the time of the look):
the inbox and the staging folder are empty; every batch journaled is complete; every batch of the
scenario has its receipt and its end steps done (``finished_at``); and no receipt of the scenario
owes an exact retrain (a late one is repaid by ``process``, which needs the registry to know how
late). Any doubt — a file that does not read, a receipt written before the tiers — is not nothing:
the full run decides. Reads only; imports only the standard library and the lock.
"""

from __future__ import annotations

import json
from pathlib import Path

from filelock import FileLock, Timeout

from fedunlearn.requests.folders import RECEIPTS_DIR, RequestFolders

EXACT_TIERS = ("exact", "formal")
NO_PENDING = "no pending requests"  # what ``process`` and ``ingest`` say when the inbox holds none


def nothing_to_process(root: Path, scenario: str) -> bool:
    """True only when a run of ``process --scenario scenario`` would change nothing and print only
    that no request is pending (module docstring)."""
    folders = RequestFolders(Path(root))
    if not folders.base.is_dir():
        return not (Path(root) / RECEIPTS_DIR).is_dir()
    lock = FileLock(folders.lock, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        return False  # a batch is running: the full run waits for it and says what it did
    try:
        return _idle(folders, Path(root), scenario)
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    finally:
        lock.release()


def _idle(folders: RequestFolders, root: Path, scenario: str) -> bool:
    if any(_entries(folders.inbox)) or any(_entries(folders.staging)):
        return False
    receipts = {}
    for path in _entries(root / RECEIPTS_DIR):
        receipt = json.loads(path.read_text())
        receipts[receipt["batch_id"]] = receipt
    for path in _entries(folders.batches):
        record = json.loads(path.read_text())
        if record.get("status") != "complete":
            return False
        if record.get("scenario") == scenario and (record.get("finished_at") is None
                                                   or record.get("batch_id") not in receipts):
            return False
    return not any(receipt.get("scenario") == scenario and _owes_exact(receipt) for receipt in receipts.values())


def _owes_exact(receipt: dict) -> bool:
    """Conservative: owed unless forgotten exactly since, on an exact tier, or nothing was unlearned."""
    if receipt.get("exactly_forgotten") is not None or receipt.get("outcome", "unlearned") != "unlearned":
        return False
    return receipt.get("forgetting") not in EXACT_TIERS


def _entries(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir()] if directory.is_dir() else []

"""What the stores other than the ledger say was applied: the evidence that a ledger entry was
written and has since been lost.

A torn or missing ledger line is harmless only if its append never returned; dropping one that
did brings its samples back into the next data version. Besides the batch records (the journals,
``integrity``), four stores are written only after the ledger append returned, so each of them
naming a request proves the append happened:

* ``processed/``: a request file moves there once its entry is durable (or was already);
* ``data/receipts/<batch_id>.json``: the receipt names the requests its batch applied;
* ``dvc.lock``: a batch record whose data version after the batch is the current one was reproduced
  from a ledger that held its entries;
* the model registry: a version tagged ``batch_id`` was unlearned or retrained for that batch. The
  core imports no MLflow: the caller passes the tagged batch IDs (``registry_batches``), read only
  when a decision would otherwise drop something.

Pure: files only, no orchestration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedunlearn.data.store import PARTITIONS_DIR
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.requests.folders import RECEIPTS_DIR, RequestFolders

RegistryBatches = Callable[[], Collection[str]]
_RENAMED = re.compile(r"^(?P<stem>[^.]*)-\d+(?P<rest>\..*)$")  # free_name's "<stem>-<n>.json" for a taken name


@dataclass(frozen=True)
class AppliedElsewhere:
    """A request (or, from the registry, a batch) that a store shows applied while the ledger has
    no entry for it."""

    store: str  # "processed request file" | "receipt" | "data version (dvc.lock)" | "model registry"
    path: Path | str
    request_id: str | None = None
    batch_id: str | None = None
    scenario: str | None = None

    def __str__(self) -> str:
        who = f"request {self.request_id}" if self.request_id else f"{self.batch_id}"
        batch = f" (in {self.batch_id})" if self.request_id and self.batch_id else ""
        return f"{who}{batch} is applied according to the {self.store} {self.path}, but the ledger has no entry for it"


@dataclass(frozen=True)
class ProcessedRequest:
    """A file in ``processed/`` and the request ID it was applied under."""

    path: Path
    request_id: str
    document: dict


def processed_requests(folders: RequestFolders, known: Collection[str]) -> list[ProcessedRequest]:
    """The files in ``processed/`` whose request is not in ``known`` (the ledger's request IDs). A
    file named ``<request_id>.json`` of a known request is not opened: a batch reads this folder
    every time, and it grows with every request ever applied."""
    found = []
    if not folders.processed.is_dir():
        return found
    for path in sorted(folders.processed.iterdir()):
        names = _names_for(path.name)
        if not path.name.endswith(".json") or names & set(known) or not path.is_file() or path.is_symlink():
            continue
        try:
            document = json.loads(path.read_bytes())
        except ValueError:
            continue  # not a request: nothing in it can be evidence
        if not isinstance(document, dict):
            continue
        explicit = document.get("request_id")
        if isinstance(explicit, str) and explicit:
            if explicit not in known:
                found.append(ProcessedRequest(path, explicit, document))
        else:  # named after its file in the inbox, which a move into a taken name may have renamed
            found.append(ProcessedRequest(path, path.name.removesuffix(".json"), document))
    return found


def _names_for(file_name: str) -> set[str]:
    """The request IDs a processed file's name can stand for: its stem, and the stem before a
    ``-<n>`` that ``free_name`` added when the name was taken."""
    names = {file_name.removesuffix(".json")}
    renamed = _RENAMED.match(file_name)
    if renamed:
        names.add((renamed["stem"] + renamed["rest"]).removesuffix(".json"))
    return names


@dataclass(frozen=True)
class ReceiptFacts:
    """What a receipt says about the ledger, read without validating the whole receipt."""

    path: Path
    batch_id: str
    scenario: str | None
    request_ids: tuple[str, ...]
    data_version_before: str | None
    data_version_after: str | None


# Receipts read by this process, by path, with the size and modification time they were read at: a
# long-lived process (the CLI's, a test's) checks the ledger before every batch, and receipts are written once.
_READ: dict[Path, tuple[tuple[int, int], ReceiptFacts | None]] = {}


def receipt_facts(root: Path) -> list[ReceiptFacts]:
    """Every readable receipt of the workspace (any scenario)."""
    facts = []
    for path in sorted((Path(root) / RECEIPTS_DIR).glob("*.json")):
        try:
            status = path.stat()
        except FileNotFoundError:
            continue
        stamp = (status.st_size, status.st_mtime_ns)
        if path not in _READ or _READ[path][0] != stamp:
            _READ[path] = (stamp, _read_receipt(path))
        if _READ[path][1] is not None:
            facts.append(_READ[path][1])
    return facts


def _read_receipt(path: Path) -> ReceiptFacts | None:
    try:
        document = json.loads(path.read_bytes())
        return ReceiptFacts(path, str(document["batch_id"]), document.get("scenario"),
                            tuple(str(r) for r in document.get("request_ids") or ()),
                            document.get("data_version_before"), document.get("data_version_after"))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a receipt that does not read back is the receipt's problem, not evidence either way


def current_data_versions(root: Path) -> dict[str, str]:
    """scenario → its current data version, as ``dvc.lock`` records it (what ``data_version`` of
    ``stores.workspace`` reads, without DVC)."""
    lock = Path(root) / "dvc.lock"
    if not lock.is_file():
        return {}
    try:
        stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    except yaml.YAMLError:
        return {}
    versions = {}
    for stage, spec in stages.items():
        if not stage.startswith("partition@"):
            continue
        scenario = stage.removeprefix("partition@")
        for out in (spec or {}).get("outs", []):
            if out.get("path") == (PARTITIONS_DIR / scenario).as_posix() and out.get("md5"):
                versions[scenario] = out["md5"].removesuffix(".dir")
    return versions


def applied_elsewhere(folders: RequestFolders, present: set[str], present_batches: set[str],
                      records: list[BatchRecord], registry_batches: RegistryBatches | None = None
                      ) -> list[AppliedElsewhere]:
    """Every request (or batch) another store shows applied that the ledger (``present`` request
    IDs, ``present_batches`` batch IDs) lacks; ``records``: the readable batch records. The
    registry is asked only when given: a tagged batch counts when neither the ledger, a readable
    record nor a receipt knows it (those name its requests, and are checked request by request)."""
    root = folders.workspace
    found = [AppliedElsewhere("processed request file", p.path, p.request_id)
             for p in processed_requests(folders, present)]
    receipts = receipt_facts(root)
    for receipt in receipts:
        found += [AppliedElsewhere("receipt", receipt.path, r, receipt.batch_id, receipt.scenario)
                  for r in receipt.request_ids if r not in present]
    unmatched = [r for r in records if any(e.request_id not in present for e in r.requests)]
    versions = current_data_versions(root) if unmatched else {}  # dvc.lock is parsed only when it can decide
    for record in unmatched:
        if record.data_version_after and versions.get(record.scenario) == record.data_version_after:
            found += [AppliedElsewhere(f"data version {record.data_version_after}, the one after "
                                       f"{record.batch_id}, in", root / "dvc.lock", e.request_id, record.batch_id, record.scenario)
                      for e in record.requests if e.request_id not in present]
    if registry_batches is not None:
        known = present_batches | {r.batch_id for r in records} | {r.batch_id for r in receipts}
        found += [AppliedElsewhere("model registry (versions tagged batch_id)", "mlflow", batch_id=b)
                  for b in sorted(set(registry_batches()) - known)]
    return found

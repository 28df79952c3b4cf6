"""Every leaf of the Merkle log checked against the record it speaks for, before anything is signed.

A log signs what it is given (RFC 9162 §8: monitors check it against the source); here the operator's
own tools are the monitor, so each leaf kind has its source of truth, read by the layer that can:

    deletion     the ledger entry at the same position (``log._ledger_problems``)
    batch        the batch's receipt (every field the leaf holds, recomputed) and its batch record;
                 the serving version registered, its weights' digest the one the leaf commits to
    exact        the receipt's ``exactly_forgotten`` (version, by, at); that version registered,
                 an exact retrain (or repayment) or formal, its weights' digest
    retirement   the version's tombstone: ``retirement`` retired (or retiring), ``retired_by``,
                 ``weights_sha256``
    hold         the version's ``hold`` tag (the latest hold leaf of a version: its reason)

A leaf no record backs is damage: ``unbacked_leaves`` names it (its index, kind, key and what is
missing) and the log signs nothing over it. Pure: the records come in as typed values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from fedunlearn.receipts import Receipt
from fedunlearn.transparency.statements import BATCH, DELETIONS, EXACT, HOLD, RETIREMENT, canonical

# The digest of a version's weights, as the registry can tell it (None: it cannot be read).
Digest = Callable[[str, str], str | None]
ModelHash = Digest  # the name the log gives it: (scenario, version) -> SHA-256 hex
EXACT_ROLES = ("retrained", "repaid")  # trained from scratch without the data (a repayment: on the shards it owed)
RETIRED_STATES = ("retiring", "retired")


@dataclass(frozen=True)
class VersionView:
    """A registered version as its tags describe it: what a leaf about it may claim."""

    scenario: str
    version: str
    role: str | None = None
    forgetting: str | None = None  # interim | exact | formal
    certificate: str | None = None
    retirement: str | None = None  # retiring | retired
    retired_by: str | None = None
    retired_at: str | None = None
    weights_sha256: str | None = None  # the tombstone's digest of the weights it had
    hold: str | None = None  # the reason of a hold
    hold_at: str | None = None

    @property
    def key(self) -> str:
        return f"{self.scenario} v{self.version}"

    @property
    def exact(self) -> bool:
        """Whether its weights never learnt what its batches deleted: an exact retrain or formal."""
        return (self.forgetting in ("exact", "formal") or self.role in EXACT_ROLES
                or (self.certificate or "").startswith("formal"))


@dataclass(frozen=True)
class Backing:
    """The records the leaves are checked against. ``versions`` None: the registry was not read
    (a workspace without one); the leaves about versions are then checked against the receipts alone."""

    receipts: dict[str, Receipt] = field(default_factory=dict)  # batch ID -> receipt
    batch_records: frozenset[str] = frozenset()  # batch IDs whose record is on file
    versions: dict[tuple[str, str], VersionView] | None = None
    digest: Digest | None = None


@dataclass(frozen=True)
class Unbacked:
    """A leaf no record backs."""

    index: int
    kind: str
    key: str
    missing: str

    def line(self) -> str:
        return f"leaf {self.index} ({self.kind} {self.key}) is backed by no record: {self.missing}"


def unbacked_leaves(records: list, backing: Backing) -> list[Unbacked]:
    """Each leaf (``log.LeafRecord``) but the deletions whose record does not back it, in log order."""
    last_hold = {r.key: r.index for r in records if r.kind == "hold"}
    found = []
    for record in records:
        if record.kind == "deletion":
            continue
        try:
            statement = json.loads(record.leaf)
        except ValueError:
            statement = None
        if not isinstance(statement, dict):
            missing = "the leaf is not a JSON statement"
        else:
            missing = _missing(record, statement, backing, last_hold.get(record.key) == record.index)
        if missing:
            found.append(Unbacked(record.index, record.kind, record.key, missing))
    return found


def _missing(record, statement: dict[str, Any], backing: Backing, latest_hold: bool) -> str | None:
    expected = {"batch": BATCH, "exact": EXACT, "retirement": RETIREMENT, "hold": HOLD}
    if record.kind not in expected:
        return f"kind {record.kind!r} is no statement fedunlearn writes"
    if statement.get("type") != expected[record.kind] or statement.get("type") in DELETIONS:
        return f"a {record.kind} leaf whose statement is of type {statement.get('type')!r}"
    if record.kind == "batch":
        return _batch_missing(record.key, statement, backing)
    if record.kind == "exact":
        return _exact_missing(record.key, statement, backing)
    return _version_leaf_missing(record.kind, record.key, statement, backing, latest_hold)


def _receipt_missing(key: str, statement: dict[str, Any], backing: Backing) -> str | None:
    if statement.get("batch_id") != key:
        return f"the leaf names batch {statement.get('batch_id')!r}, its record {key!r}"
    if key not in backing.receipts:
        return f"no receipt of batch {key} (data/receipts/{key}.json)"
    if key not in backing.batch_records:
        return f"no batch record of {key} (data/deletion_requests/batches/{key}.json)"
    return None


def _batch_missing(key: str, statement: dict[str, Any], backing: Backing) -> str | None:
    missing = _receipt_missing(key, statement, backing)
    if missing:
        return missing
    serving = statement.get("serving") if isinstance(statement.get("serving"), dict) else {}
    claimed = serving.get("model_sha256")
    recomputed = json.loads(batch_leaf(backing.receipts[key], lambda _s, _v: claimed))
    differs = _differing(statement, recomputed)
    if differs:
        return f"its receipt says otherwise ({', '.join(differs)})"
    if serving:
        return _version_missing(statement.get("scenario"), serving.get("version"), claimed, backing,
                                "the serving version")
    return None


def _exact_missing(key: str, statement: dict[str, Any], backing: Backing) -> str | None:
    missing = _receipt_missing(key, statement, backing)
    if missing:
        return missing
    receipt = backing.receipts[key]
    if receipt.exactly_forgotten is None:
        return f"the receipt of {key} does not say it was forgotten exactly (its forgetting: {receipt.forgetting})"
    claimed = statement.get("model_sha256")
    differs = _differing(statement, json.loads(exact_leaf(receipt, lambda _s, _v: claimed)))
    if differs:
        return f"its receipt says otherwise ({', '.join(differs)})"
    missing = _version_missing(statement.get("scenario"), statement.get("version"), claimed, backing,
                               "the exact version")
    view = (backing.versions or {}).get((str(statement.get("scenario")), str(statement.get("version"))))
    if missing is None and view is not None and not view.exact:
        return (f"{view.key} is no exact retrain and not formal (role {view.role}, forgetting {view.forgetting}, "
                f"certificate {view.certificate})")
    return missing


def _version_missing(scenario, version, claimed: str | None, backing: Backing, what: str) -> str | None:
    """The version a statement names must be registered, and its weights those the statement hashed."""
    if backing.versions is None:
        return None
    view = backing.versions.get((str(scenario), str(version)))
    if view is None:
        return f"{what}, {scenario} v{version}, is not registered"
    if claimed is None:
        return None
    actual = view.weights_sha256 or (backing.digest(view.scenario, view.version) if backing.digest else None)
    if actual is not None and actual != claimed:
        return f"{what}'s weights ({view.key}) have digest {actual[:12]}…, the leaf {str(claimed)[:12]}…"
    return None


def _version_leaf_missing(kind: str, key: str, statement: dict[str, Any], backing: Backing,
                          latest_hold: bool) -> str | None:
    scenario, version = statement.get("scenario"), statement.get("version")
    if key != f"{scenario} v{version}":
        return f"the leaf names {scenario} v{version}, its record {key!r}"
    if backing.versions is None:
        return None
    view = backing.versions.get((str(scenario), str(version)))
    if view is None:
        return f"{key} is not registered"
    if kind == "hold":
        if not view.hold:
            return f"{key} carries no hold tag"
        if latest_hold and statement.get("reason") != view.hold:
            return f"{key}'s hold tag gives another reason"
        return None
    if view.retirement not in RETIRED_STATES:
        return f"{key} is not retired in the registry (tag retirement: {view.retirement})"
    if statement.get("retired_by") != view.retired_by:
        return f"{key} was retired by {view.retired_by}, the leaf says {statement.get('retired_by')}"
    if statement.get("weights_sha256") != view.weights_sha256:
        return f"{key}'s tombstone keeps another weights digest than the leaf"
    return None


def _differing(statement: dict[str, Any], recomputed: dict[str, Any]) -> list[str]:
    keys = sorted(set(statement) | set(recomputed))
    return [k for k in keys if statement.get(k) != recomputed.get(k)][:4]


def batch_leaf(receipt: Receipt, model_hash: ModelHash | None) -> bytes:
    """What the operator commits to for a batch; other subjects' request IDs are only counted."""
    serving = receipt.models.get("unlearned") if receipt.promoted else receipt.models.get("current")
    digest = model_hash(receipt.scenario, serving.version) if serving and model_hash else None
    return canonical({"type": BATCH, "batch_id": receipt.batch_id, "scenario": receipt.scenario,
                      "receipt_created_at": leaf_time(receipt.created_at), "request_count": len(receipt.request_ids),
                      "data_version_before": receipt.data_version_before,
                      "data_version_after": receipt.data_version_after, "outcome": receipt.outcome,
                      "method": receipt.method, "guarantee": receipt.guarantee,
                      "promoted": receipt.promoted, "forgetting": receipt.forgetting,
                      "exact_due": leaf_time(receipt.exact_due),
                      "serving": {"version": serving.version, "data_version": serving.data_version,
                                  "model_sha256": digest} if serving else None})


def exact_leaf(receipt: Receipt, model_hash: ModelHash | None) -> bytes:
    done = receipt.exactly_forgotten
    return canonical({"type": EXACT, "batch_id": receipt.batch_id, "scenario": receipt.scenario,
                      "at": leaf_time(done.at), "version": done.version, "by": done.by,
                      "model_sha256": model_hash(receipt.scenario, done.version) if model_hash else None})


def leaf_time(value) -> str | None:
    return value.isoformat() if value is not None else None


# --- the statements about versions the registry calls for -------------------------------------------------

def retirement_leaf(view: VersionView) -> bytes:
    """The retirement leaf (``statements.retirement_leaf``: a subject's receipt proves the same bytes)."""
    from fedunlearn.transparency import statements

    return statements.retirement_leaf(view.scenario, view.version, view.retired_by, view.weights_sha256,
                                      view.retired_at)


def hold_leaf(view: VersionView) -> bytes:
    return canonical({"type": HOLD, "scenario": view.scenario, "version": view.version, "reason": view.hold,
                      "at": view.hold_at})


def version_statements(records: list, versions: dict[tuple[str, str], VersionView] | None
                       ) -> list[tuple[str, str, bytes]]:
    """(kind, key, leaf) the registry calls for that the log lacks: a retirement leaf per retired
    version without one (a run killed after the tombstone and before its leaf is completed here),
    a hold leaf per hold whose reason the log does not hold yet."""
    retired = {r.key for r in records if r.kind == "retirement"}
    holds = {r.key: json.loads(r.leaf).get("reason") for r in records if r.kind == "hold"}
    new = []
    for view in sorted((versions or {}).values(), key=lambda v: (v.scenario, int(v.version)
                                                                 if v.version.isdigit() else 0)):
        if view.retirement == "retired" and view.key not in retired:
            new.append(("retirement", view.key, retirement_leaf(view)))
        elif view.hold and view.retirement is None and holds.get(view.key, None) != view.hold:
            new.append(("hold", view.key, hold_leaf(view)))
    return new

"""What a leaf says, and the commitments in it: shared by the operator's log and the subject's
verification, which imports nothing heavier than ``hashlib`` (``verify-receipt`` loads no torch).

A deletion leaf names no sample ID and no hash anyone can recompute without the request's salt:
``ids_commitment`` is HMAC-SHA256 keyed by the salt over the canonical ID list, and (since v2)
``ledger_commitment`` is HMAC-SHA256 keyed by the same salt over the ledger entry's checksum, the
entry's SHA-256, which holds the IDs and so must not be published bare.

The canonical ID list (``canonical_ids``) is what ``--ids`` of ``verify-receipt`` and ``fedunlearn
request`` agree on: the IDs, each once, sorted by code point, as the RFC 8785 (JCS) JSON array
without whitespace, UTF-8 encoded — ``["digits-00012","digits-00345"]``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Any, Iterable

DELETION_V1 = "fedunlearn.deletion@v1"  # leaves of the log's first format: a bare ledger_checksum, spaced ID JSON
DELETION = "fedunlearn.deletion@v2"
DELETIONS = (DELETION_V1, DELETION)
BATCH, EXACT = "fedunlearn.batch-receipt@v1", "fedunlearn.exact-forgetting@v1"
RETIREMENT, HOLD = "fedunlearn.retirement@v1", "fedunlearn.hold@v1"
LEDGER_DOMAIN = b"fedunlearn.ledger-entry@v1\n"  # so that no ID commitment can pass for a ledger one


def canonical(document: dict[str, Any]) -> bytes:
    """The leaf's bytes: one JSON form for one content, so that anyone can recompute its hash."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def split_ids(text: str) -> list[str]:
    """Sample IDs as ``fedunlearn request samples --ids``/``--ids-file`` reads them: separated by
    whitespace or commas, empty pieces dropped."""
    return [i for i in re.split(r"[\s,]+", text) if i]


def canonical_ids(sample_ids: Iterable[str]) -> bytes:
    """The IDs, each once, sorted by code point, as JCS JSON (no whitespace, UTF-8)."""
    return json.dumps(sorted(set(sample_ids)), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def ids_commitment(salt: bytes, sample_ids: Iterable[str], leaf_type: str = DELETION) -> str:
    """HMAC-SHA256 keyed by the salt over the ID list: hiding without the salt (the IDs are
    guessable, the salt is not) and binding. v1 leaves hashed Python's spaced ``json.dumps``."""
    ids = sorted(set(sample_ids))
    message = json.dumps(ids).encode() if leaf_type == DELETION_V1 else canonical_ids(ids)
    return hmac.new(salt, message, hashlib.sha256).hexdigest()


def ledger_commitment(salt: bytes, checksum: str) -> str:
    """The ledger entry's checksum, keyed by the request's salt: the operator can still tell a
    changed entry (``ledger verify``), nobody without the salt can test a guess against it."""
    return hmac.new(salt, LEDGER_DOMAIN + checksum.encode(), hashlib.sha256).hexdigest()


def retirement_key(scenario: str, version: str) -> str:
    """The log's key of a version's retirement (and of its hold): ``<scenario> v<version>``."""
    return f"{scenario} v{version}"


def retirement_leaf(scenario: str, version: str, batch_id: str, weights_sha256: str | None, at: str | None) -> bytes:
    """A version's retirement: the batch whose exact forgetting retired it, the digest of the weights
    it had (``sha256sum``-style over its weights files) and when they were deleted."""
    return canonical({"type": RETIREMENT, "scenario": scenario, "version": version, "retired_by": batch_id,
                      "weights_sha256": weights_sha256, "at": at})

"""The receipt a data subject takes away, and its verification with nothing but the file and the
log's public key.

The file is a C2SP ``tlog-proof`` (``c2sp.org/tlog-proof@v1``): the index of the request's leaf,
its inclusion proof and the signed checkpoint verbatim; its ``extra`` line is base64 of canonical
JSON holding the leaf itself (so that its hash can be recomputed), the salt of the sample-ID
commitment, the batch's statements (batch receipt, exact forgetting) and the retirements of the
versions that learnt the request's samples (those the batch's receipt names) with their own inclusion
proofs, and — in a file ``ledger prove-consistency`` made — a consistency proof from an older
tree head the subject kept. ``extra`` is not trusted by itself (tlog-proof says so): every leaf in
it counts only once its inclusion proof checks against the signed head, and the consistency proof
counts only against the older head's own signature.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedunlearn.errors import InputError
from fedunlearn.transparency import merkle
from fedunlearn.transparency.failures import LogInconsistent, NotIncluded, ReceiptMalformed
from fedunlearn.transparency.note import Checkpoint, Verifier, open_checkpoint, split_note
from fedunlearn.transparency.statements import (BATCH, DELETIONS, EXACT, RETIREMENT, canonical, ids_commitment,
                                                retirement_key)
from fedunlearn.transparency.untrusted import CONTROL, canonical_number, strict_b64

if TYPE_CHECKING:  # the operator's side only: the log pulls in the ledger and the batch receipts
    from fedunlearn.transparency.log import TransparencyLog

HEADER = "c2sp.org/tlog-proof@v1"
FORMAT = "fedunlearn.receipt@v1"
MAX_PROOF = 64  # hashes in an inclusion or consistency proof of a tree below 2**63 leaves
MAX_STATEMENTS = 64  # a batch logs one receipt, at most one exact forgetting, its versions' retirements


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any, source: str, what: str) -> bytes:
    return strict_b64(text, source, what)


def _hash_list(values: Any, source: str, what: str) -> list[bytes]:
    if not isinstance(values, list) or len(values) > MAX_PROOF:
        raise ReceiptMalformed(f"{source}: {what} is not a list of at most {MAX_PROOF} hashes")
    return [strict_b64(value, source, what, merkle.HASH_SIZE) for value in values]


def _count(value: Any, source: str, what: str) -> int:
    if type(value) is not int or not 0 <= value <= (1 << 63) - 1:  # bool is an int to Python, not to a receipt
        raise ReceiptMalformed(f"{source}: {what} is not a whole number from 0 to 2**63-1")
    return value


def _read_extra(encoded: str, source: str) -> dict[str, Any]:
    """The extra line: canonical base64 of canonical JSON (as ``canonical`` writes it), an object."""
    raw = strict_b64(encoded, source, "the extra line")
    try:
        extra = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise ReceiptMalformed(f"{source}: the extra line does not hold JSON") from None
    if not isinstance(extra, dict) or extra.get("format") != FORMAT:
        raise ReceiptMalformed(f"{source}: not a {FORMAT} receipt (its extra data is not one)")
    if canonical(extra) != raw:
        raise ReceiptMalformed(f"{source}: the extra line's JSON is not in canonical form (sorted keys, no "
                               "whitespace, no duplicate keys): it was not written by `fedunlearn receipt`")
    _check_extra(extra, source)
    return extra


def _check_extra(extra: dict[str, Any], source: str) -> None:
    """Every field a verifier reads has the type it reads it as (the values are checked later)."""
    for key in ("leaf", "leaf_hash", "salt", "note"):
        if key in extra and not isinstance(extra[key], str):
            raise ReceiptMalformed(f"{source}: the extra data's {key!r} is not a string")
    if ("leaf" in extra) == ("leaf_hash" in extra):
        raise ReceiptMalformed(f"{source}: the extra data holds neither the leaf nor its hash (or both)")
    statements = extra.get("statements", [])
    if not isinstance(statements, list) or len(statements) > MAX_STATEMENTS:
        raise ReceiptMalformed(f"{source}: the extra data's statements are not a list of at most {MAX_STATEMENTS}")
    for item in statements:
        if not isinstance(item, dict) or not isinstance(item.get("leaf"), str):
            raise ReceiptMalformed(f"{source}: a statement in the extra data is not (index, leaf, proof)")
        _count(item.get("index"), source, "a statement's index")
        _hash_list(item.get("proof"), source, "a statement's proof")
    consistency = extra.get("consistency")
    if consistency is not None:
        if not isinstance(consistency, dict):
            raise ReceiptMalformed(f"{source}: the consistency proof is not (old_size, old_root, proof)")
        _count(consistency.get("old_size"), source, "the consistency proof's old size")
        strict_b64(consistency.get("old_root"), source, "the consistency proof's old root", merkle.HASH_SIZE)
        _hash_list(consistency.get("proof"), source, "the consistency proof")


@dataclass
class ProofFile:
    extra: dict[str, Any]
    index: int
    proof: list[bytes]
    note: str

    def text(self) -> str:
        lines = [HEADER, "extra " + _b64(canonical(self.extra)), f"index {self.index}", *map(_b64, self.proof)]
        return "\n".join(lines) + "\n\n" + self.note

    @classmethod
    def parse(cls, text: str, source: str) -> "ProofFile":
        """C2SP tlog-proof: the header, ``extra``, ``index``, the proof's hashes, an empty line,
        the signed checkpoint; every line as the specification and ``fedunlearn receipt`` write it."""
        head, separator, note = text.partition("\n\n")
        lines = head.split("\n")
        if not separator or lines[0] != HEADER:
            raise ReceiptMalformed(f"{source} is not a receipt: its first line is not {HEADER!r} (a receipt is what "
                                   "`fedunlearn receipt` or `fedunlearn ledger prove-consistency` wrote)")
        if CONTROL.search(head):
            raise ReceiptMalformed(f"{source} holds a control character (CRLF line ends, NUL): not a receipt; copy "
                                   "the file as it was handed to you")
        if len(lines) < 3 or not lines[1].startswith("extra ") or not lines[2].startswith("index "):
            raise ReceiptMalformed(f"{source}: the receipt lacks its 'extra' or 'index' line")
        extra = _read_extra(lines[1][len("extra "):], source)
        index = canonical_number(lines[2][len("index "):], source, "the index")
        if len(lines) - 3 > MAX_PROOF:
            raise ReceiptMalformed(f"{source}: the inclusion proof has more than {MAX_PROOF} hashes")
        proof = [strict_b64(line, source, "an inclusion proof line", merkle.HASH_SIZE) for line in lines[3:]]
        return cls(extra, index, proof, note)


@dataclass
class OldHead:
    """What a subject kept: a receipt (a head and their leaf) or a bare signed tree head."""

    checkpoint: Checkpoint
    index: int | None = None
    leaf: bytes | None = None


def read_kept(text: str, verifier: Verifier, source: str) -> OldHead:
    """A receipt (its inclusion checked too) or a signed checkpoint, its signature checked."""
    if text.startswith(HEADER):
        file = ProofFile.parse(text, source)
        checkpoint = open_checkpoint(file.note, verifier, source)
        leaf = _check_inclusion(file, checkpoint, source)
        return OldHead(checkpoint, file.index, leaf)
    split_note(text, source)
    return OldHead(open_checkpoint(text, verifier, source))


def _check_inclusion(file: ProofFile, checkpoint: Checkpoint, source: str) -> bytes | None:
    """The leaf (None: a proof for a witness carries only its hash), once it is shown included."""
    leaf = _unb64(file.extra["leaf"], source, "the leaf") if "leaf" in file.extra else None
    hashed = merkle.leaf_hash(leaf) if leaf is not None else strict_b64(file.extra["leaf_hash"], source,
                                                                         "the leaf hash", merkle.HASH_SIZE)
    if not merkle.verify_inclusion(hashed, file.index, checkpoint.size, file.proof, checkpoint.root):
        raise NotIncluded(f"{source}: the entry is NOT in the log: its inclusion proof does not lead from leaf "
                          f"{file.index} to the root of the signed tree head (size {checkpoint.size}); the leaf or "
                          "the proof was changed, or the entry is not in that log")
    return leaf


# --- the operator's side -----------------------------------------------------------------------------

def build_receipt(log: TransparencyLog, request_id: str | None, consistency: dict[str, Any] | None = None) -> str:
    """The receipt of ``request_id`` against the log's latest signed head (the caller syncs first);
    without a request, a proof about the log alone for a witness, which carries the last leaf's
    hash only: no subject's leaf or salt goes to anyone but that subject."""
    records, note = log.records(), log.head()
    size = Checkpoint.parse(split_note(note, "head")[0], "head").size if note else 0
    if request_id is None and size:
        mine = records[size - 1]
    else:
        mine = next((r for r in records if r.kind == "deletion" and r.key == request_id), None)
    if mine is None or mine.index >= size:
        raise InputError(f"request {request_id} is not in the deletion ledger, so it has no receipt: a pending "
                         "request gets one once a batch applied it (`fedunlearn status` lists every request)")
    hashes = [r.hash for r in records[:size]]
    if request_id is None:
        extra: dict[str, Any] = {"format": FORMAT, "leaf_hash": _b64(mine.hash), "statements": [],
                                 "note": "a proof about the log alone (for a witness): it names no entry"}
    else:
        extra = {"format": FORMAT, "leaf": _b64(mine.leaf), "salt": _b64(mine.salt or b""),
                 "statements": _statements(records[:size], hashes, mine.statement.get("batch_id"),
                                           _retired_keys(log, mine.statement)),
                 "note": "verify with `fedunlearn verify-receipt FILE --public-key log.pub`; the salt opens "
                         "ids_commitment (HMAC-SHA256 of your sample IDs, canonical) and so tells your IDs to "
                         "whoever holds this file: keep it as you keep the ID list"}
    if consistency is not None:
        extra["consistency"] = consistency
    return ProofFile(extra, mine.index, merkle.inclusion_proof(hashes, mine.index), note).text()


def _statements(records: list, hashes: list[bytes], batch_id: str | None,
                retired: set[str] = frozenset()) -> list[dict[str, Any]]:
    """The batch's own statements (receipt, exact forgetting) and the retirements of the versions
    that learnt its samples (``retired``: their log keys), with their inclusion proofs."""
    return [{"index": r.index, "leaf": _b64(r.leaf),
             "proof": [_b64(h) for h in merkle.inclusion_proof(hashes, r.index)]}
            for r in records if (r.kind in ("batch", "exact") and r.key == batch_id)
            or (r.kind == "retirement" and r.key in retired)]


def _retired_keys(log: TransparencyLog, deletion: dict[str, Any]) -> set[str]:
    """The log keys of the retirements the batch's receipt names: the versions that learnt the
    request's samples and lost their weights once it was exactly forgotten."""
    from fedunlearn.receipts import read_receipt

    receipt = read_receipt(log.root, deletion["batch_id"]) if deletion.get("batch_id") else None
    return {retirement_key(receipt.scenario, v) for v in receipt.retired} if receipt is not None else set()


def prove_consistency(log: TransparencyLog, kept: str, source: str, request_id: str | None = None) -> str:
    """A receipt against today's signed head that also proves OLD's log a prefix of today's. Refuses
    (``LogInconsistent``) when it is not: no file can honestly say otherwise."""
    from fedunlearn.transparency.log import read_verifier

    old = read_kept(kept, read_verifier(log.root), source)
    records, note = log.records(), log.head()
    checkpoint = Checkpoint.parse(split_note(note, "the log's head")[0], "the log's head")
    hashes = [r.hash for r in records[:checkpoint.size]]
    if old.checkpoint.size > checkpoint.size or merkle.root(hashes[:old.checkpoint.size]) != old.checkpoint.root:
        raise LogInconsistent(f"the log today (size {checkpoint.size}) does not extend the tree head in {source} (size "
                              f"{old.checkpoint.size}): its first {old.checkpoint.size} leaves no longer hash to that "
                              "head's root — entries were removed or changed since it was signed; no consistency "
                              "proof exists")
    if old.leaf is not None:  # OLD is a subject's receipt: today's file is theirs too
        statement = _statement(old.leaf, source)
        request_id = statement.get("request_id") if statement.get("type") in DELETIONS else request_id
    proof = merkle.consistency_proof(hashes, old.checkpoint.size) if 0 < old.checkpoint.size < len(hashes) else []
    return build_receipt(log, request_id, {"old_size": old.checkpoint.size, "old_root": _b64(old.checkpoint.root),
                                           "proof": [_b64(h) for h in proof]})


# --- the subject's side: no workspace ----------------------------------------------------------------

def verify_receipt(text: str, verifier: Verifier, source: str, kept: str | None = None, kept_source: str = "",
                   sample_ids: list[str] | None = None) -> list[str]:
    """Check the signature, the inclusion of the leaf and of every statement, with ``kept`` that
    the log it saw is a prefix of this one, with ``sample_ids`` the commitment. Returns what was
    verified, in words; raises the failure's class (``failures``) at the first failed check."""
    file = ProofFile.parse(text, source)
    checkpoint = open_checkpoint(file.note, verifier, source)
    leaf = _check_inclusion(file, checkpoint, source)
    statement = _statement(leaf, source) if leaf is not None else {}
    lines = [f"key: {verifier.name} (key ID {verifier.key_id.hex()}) signed the tree head of log "
             f"{checkpoint.origin} (size {checkpoint.size}, root {_b64(checkpoint.root)})"]
    consistency = (lambda: _check_consistency(file, checkpoint, leaf, read_kept(kept, verifier, kept_source),
                                              source, kept_source))
    if statement.get("type") not in DELETIONS:  # a proof about the log alone (for a witness)
        if sample_ids is not None:
            raise ReceiptMalformed(f"{source} is no request's receipt (it proves the log alone): it has no sample-ID "
                                   "commitment to check")
        lines.append(_describe(statement, file.index) if leaf is not None else
                     f"included: leaf {file.index} (its hash only: a proof about the log alone, for a witness)")
        return lines + ([consistency()] if kept is not None else [])
    lines.append(f"included: request {statement.get('request_id')} is leaf {file.index} of that log: applied "
                 f"{statement.get('applied_at')} in {statement.get('batch_id')} ({statement.get('scenario')}), "
                 f"{statement.get('ids_count')} sample IDs committed to")
    lines += _verify_statements(file, checkpoint, statement, source)
    lines += _retired_summary(file, statement, source)
    if sample_ids is not None:
        lines.append(_check_commitment(file, statement, sample_ids, source))
    return lines + ([consistency()] if kept is not None else [])


def _statement(leaf: bytes, source: str) -> dict[str, Any]:
    try:
        statement = json.loads(leaf.decode("utf-8"))
    except (ValueError, RecursionError):
        raise ReceiptMalformed(f"{source}: a leaf is not a JSON statement") from None
    if not isinstance(statement, dict):
        raise ReceiptMalformed(f"{source}: a leaf is not a JSON statement")
    return statement


def _verify_statements(file: ProofFile, checkpoint: Checkpoint, deletion: dict[str, Any], source: str) -> list[str]:
    lines = []
    for item in file.extra.get("statements", []):  # their types were checked when the file was read
        leaf = _unb64(item["leaf"], source, "a statement's leaf")
        proof = [_unb64(h, source, "a statement's proof") for h in item["proof"]]
        if item["index"] >= checkpoint.size or not merkle.verify_inclusion(
                merkle.leaf_hash(leaf), item["index"], checkpoint.size, proof, checkpoint.root):
            raise NotIncluded(f"{source}: the statement at leaf {item['index']} is NOT in the signed log (its "
                              "inclusion proof fails): it was changed after it was logged")
        statement = _statement(leaf, source)
        if statement.get("type") == RETIREMENT:
            if statement.get("scenario") != deletion.get("scenario"):
                raise ReceiptMalformed(f"{source}: the retirement at leaf {item['index']} is of a model of another "
                                       f"scenario than the request's {deletion.get('scenario')!r}")
        elif statement.get("batch_id") != deletion.get("batch_id"):
            raise ReceiptMalformed(f"{source}: the statement at leaf {item['index']} is about another batch than "
                                   f"the request's {deletion.get('batch_id')!r}")
        lines.append(_describe(statement, item["index"]))
    if not lines:
        lines.append("the batch's receipt was not logged yet when this file was made (ask for a newer receipt)")
    return lines


def _describe(statement: dict[str, Any], index: int) -> str:
    if statement.get("type") == BATCH:
        serving = statement.get("serving") if isinstance(statement.get("serving"), dict) else {}
        return (f"included: {statement.get('batch_id')} (leaf {index}): data version "
                f"{statement.get('data_version_before')} -> {statement.get('data_version_after')}; serving "
                f"version {serving.get('version')} (data version {serving.get('data_version')}, model sha256 "
                f"{serving.get('model_sha256')}); forgetting {statement.get('forgetting')}, method "
                f"{statement.get('method')}, guarantee {statement.get('guarantee')}, exact due "
                f"{statement.get('exact_due')}")
    if statement.get("type") == RETIREMENT:
        return (f"included: retirement of {statement.get('scenario')} v{statement.get('version')} (leaf {index}) at "
                f"{statement.get('at')} by {statement.get('retired_by')}: weights deleted, weights digest "
                f"{statement.get('weights_sha256')}")
    if statement.get("type") == EXACT:
        return (f"included: exact forgetting of {statement.get('batch_id')} (leaf {index}) at {statement.get('at')} "
                f"by version {statement.get('version')} ({statement.get('by')}, model sha256 "
                f"{statement.get('model_sha256')})")
    return f"included: a {statement.get('type')} statement (leaf {index})"


def _retired_summary(file: ProofFile, deletion: dict[str, Any], source: str) -> list[str]:
    """``retired: v1, v2 …`` from the retirement statements just verified (none: no line)."""
    retired = [_statement(_unb64(item["leaf"], source, "a statement's leaf"), source)
               for item in file.extra.get("statements", [])]
    retired = [s for s in retired if s.get("type") == RETIREMENT]
    if not retired:
        return []
    names = ", ".join(f"v{s.get('version')}" for s in retired)
    each = "; ".join(f"v{s.get('version')} at {s.get('at')}, weights digest {s.get('weights_sha256')}" for s in retired)
    return [f"retired: {names} of {deletion.get('scenario')}, the versions that learnt these samples — their weights "
            f"deleted, each retirement in the signed log: {each}"]


def _check_commitment(file: ProofFile, statement: dict[str, Any], sample_ids: list[str], source: str) -> str:
    """The IDs given, each once and in any order (``statements.canonical_ids``), against the commitment."""
    salt = _unb64(file.extra.get("salt"), source, "the salt")
    ids = set(sample_ids)
    if not salt or ids_commitment(salt, ids, statement.get("type")) != statement.get("ids_commitment"):
        raise NotIncluded(f"{source}: the {len(ids)} sample IDs given do NOT match the commitment in the logged entry "
                          "(not the IDs this request deleted, or the list is incomplete)")
    return f"commitment: the {len(ids)} sample IDs given are the ones the logged entry commits to"


def _check_consistency(file: ProofFile, checkpoint: Checkpoint, leaf: bytes | None, old: OldHead, source: str,
                       kept_source: str) -> str:
    m, n = old.checkpoint.size, checkpoint.size
    if old.leaf is not None and (old.index != file.index or old.leaf != leaf):
        raise NotIncluded(f"{source} is not about the entry {kept_source} is a receipt for (leaf {old.index}): ask for "
                          "`fedunlearn ledger prove-consistency --since` that receipt")
    if m > n or (m == n and old.checkpoint.root != checkpoint.root):
        raise LogInconsistent(f"INCONSISTENT: the log in {kept_source} (size {m}) is not a prefix of the log in "
                              f"{source} (size {n}): the log was rewritten")
    if m == n:
        return f"consistent: {kept_source} and {source} sign the same tree (size {n})"
    consistency = file.extra.get("consistency")  # its types were checked when the file was read
    if consistency is None or consistency["old_size"] != m:
        raise ReceiptMalformed(f"{source} carries no consistency proof from size {m} (the head in {kept_source}); "
                               f"the operator makes one with `fedunlearn ledger prove-consistency --since "
                               f"{kept_source} --out FILE`")
    proof = [_unb64(h, source, "the consistency proof") for h in consistency["proof"]]
    if not merkle.verify_consistency(m, n, old.checkpoint.root, checkpoint.root, proof):
        raise LogInconsistent(f"INCONSISTENT: the consistency proof in {source} does not show the log in "
                              f"{kept_source} (size {m}) to be a prefix of the log in {source} (size {n}): the log "
                              "was rewritten since your receipt was signed")
    return f"consistent: the log in {kept_source} (size {m}) is a prefix of the log in {source} (size {n})"

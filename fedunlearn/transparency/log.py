"""The workspace's Merkle log (``data/transparency/``), kept in step with the deletion ledger and
the batch receipts, and its signing key.

One leaf per ledger entry (``deletion``), then one per batch receipt (``batch``: the data versions,
the serving version and its model hash, the tier, ``exact_due``) and one per exact forgetting
(``exact``), in the order they happened. A leaf is canonical JSON that names no sample ID: a
deletion leaf holds ``ids_commitment``, HMAC-SHA256 of the request's IDs keyed by a random salt
kept beside it in ``leaves.jsonl``, so a proof's sibling hashes tell nobody else anything and the
subject, given the salt in their receipt, can check the commitment against the IDs they asked to
delete. ``leaves.jsonl`` is as sensitive as the ledger it mirrors (which holds the IDs in clear).

Files: ``leaves.jsonl`` (one record per leaf), ``checkpoint`` (the latest signed tree head),
``head-<size>.checkpoint`` (every head ever signed), ``log.pub`` (the verifier key). The private
key is ``.secrets/transparency-log.json`` (mode 0600): ``.secrets/`` is in the workspace's
``.gitignore`` and ``.dvcignore``, outside the state snapshot pushed to the DVC remote and outside
every MLflow artifact, so that no copy of the stores carries it.

``sync`` never signs a history that disagrees with what was logged: a ledger that lost, changed or
reordered a logged entry raises ``LogRewritten``; only ``start_new_log`` (``ledger repair
--new-log``) signs again, under a visibly different origin.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from filelock import FileLock

from fedunlearn.receipts import Receipt, load_receipt
from fedunlearn.requests.folders import append_lines_durable, write_text_atomic
from fedunlearn.requests.ledger import LedgerEntry, content_checksum
from fedunlearn.transparency import merkle
from fedunlearn.transparency.backing import (Backing, ModelHash, batch_leaf, exact_leaf, leaf_time,  # noqa: F401
                                             unbacked_leaves, version_statements)
from fedunlearn.transparency.failures import LogRewritten, ReceiptMalformed
from fedunlearn.transparency.note import Checkpoint, Signer, Verifier, open_checkpoint, parse_vkey, split_note
from fedunlearn.transparency.statements import DELETION, DELETION_V1, canonical, ids_commitment, ledger_commitment

LOG_DIR = Path("data/transparency")
SECRETS_DIR = Path(".secrets")
KEY_FILE = SECRETS_DIR / "transparency-log.json"
RETIRED_ORIGINS = "retired-origins"  # origins given up by `ledger new-log`: their published heads bind no more


@dataclass
class LeafRecord:
    """One line of ``leaves.jsonl``."""

    index: int
    kind: str
    key: str  # the request ID (deletion) or batch ID (batch, exact)
    leaf: bytes
    salt: bytes | None = None

    @property
    def hash(self) -> bytes:
        return merkle.leaf_hash(self.leaf)

    @property
    def statement(self) -> dict[str, Any]:
        return json.loads(self.leaf)

    def line(self) -> str:
        document = {"index": self.index, "kind": self.kind, "key": self.key,
                    "leaf": base64.b64encode(self.leaf).decode()}
        if self.salt is not None:
            document["salt"] = base64.b64encode(self.salt).decode()
        return json.dumps(document, sort_keys=True)

    @classmethod
    def parse(cls, raw: str) -> "LeafRecord":
        document = json.loads(raw)
        salt = document.get("salt")
        return cls(int(document["index"]), document["kind"], document["key"], base64.b64decode(document["leaf"]),
                   base64.b64decode(salt) if salt else None)


def entry_checksum(entry: LedgerEntry) -> str:
    """The checksum a leaf commits to: the entry's own, or (written before chaining) its content's."""
    return entry.checksum or content_checksum(entry.document())


def deletion_leaf(entry: LedgerEntry, salt: bytes) -> bytes:
    """Everything a hash of could name an ID (the ID list, the ledger line) is keyed by the salt."""
    ids = sorted(set(entry.sample_ids) | set(entry.merged_ids))
    return canonical({"type": DELETION, "request_id": entry.request_id, "batch_id": entry.batch_id,
                      "scenario": entry.scenario, "kind": entry.kind.value if entry.kind else None,
                      "submitted_at": leaf_time(entry.submitted_at), "applied_at": leaf_time(entry.applied_at),
                      "deadline": leaf_time(entry.deadline),
                      "ledger_commitment": ledger_commitment(salt, entry_checksum(entry)),
                      "ids_count": len(ids), "ids_commitment": ids_commitment(salt, ids)})


# --- the key -----------------------------------------------------------------------------------------

def new_origin() -> str:
    """A log name no other workspace has (signed-note key names: no spaces, no '+')."""
    return f"fedunlearn.invalid/ledger/{secrets.token_hex(8)}"


def ensure_key(root: Path) -> Signer:
    """The workspace's signing key, made on first use (``fedunlearn init``); its verifier key is
    written to ``data/transparency/log.pub``. A workspace whose log exists but whose key is gone
    is refused (``LogRewritten``) and left as it was."""
    signer, made = load_signer(root)
    if made:
        _write_key(root, signer)
    write_public(root, signer)
    return signer


def init_key(root: Path) -> None:
    """``fedunlearn init`` and every flow's workspace: a key for a workspace without a log. A log
    whose key is gone or differs is left as it is, so that the workspace still trains and
    restores; signing refuses it (``sync``) until the key is restored or a new log started."""
    try:
        ensure_key(root)
    except LogRewritten:
        pass


def load_signer(root: Path) -> tuple[Signer, bool]:
    """The workspace's key, or (True) a new one, not written yet, where the workspace has no log at
    all. A key that is missing while a log exists is never replaced silently: a new key would sign
    a history nobody can tie to the old one."""
    root = Path(root)
    path = root / KEY_FILE
    if path.is_file():
        document = json.loads(path.read_text())
        return Signer.from_pem(document["origin"], document["private_key_pem"].encode()), False
    directory = root / LOG_DIR
    kept = [p.name for p in (directory / "log.pub", directory / "leaves.jsonl", directory / "checkpoint")
            if p.is_file()]
    if kept:
        raise LogRewritten(f"the Merkle log's signing key {KEY_FILE} is missing and {LOG_DIR} holds a log "
                           f"({', '.join(kept)}); nothing was touched. Restore {KEY_FILE} from your backup, or start "
                           "a new log under a new key and origin with `fedunlearn ledger new-log`")
    return Signer.generate(new_origin()), True


def write_public(root: Path, signer: Signer) -> None:
    """``log.pub`` for ``signer``; one naming another key is refused, not overwritten."""
    public = Path(root) / LOG_DIR / "log.pub"
    if public.is_file() and public.read_text().strip() != signer.verifier.vkey():
        raise LogRewritten(f"{LOG_DIR / 'log.pub'} names another key than {KEY_FILE} ({signer.verifier.vkey()}); "
                           "nothing was signed. Restore the key that matches log.pub, or start a new log with "
                           "`fedunlearn ledger new-log`")
    if not public.is_file():
        public.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(public, signer.verifier.vkey() + "\n")


def _write_key(root: Path, signer: Signer) -> Signer:
    directory = root / SECRETS_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for ignore in (".gitignore", ".dvcignore"):  # neither Git nor DVC may ever pick the key up
        listed = root / ignore
        lines = listed.read_text().splitlines() if listed.is_file() else []
        if f"/{SECRETS_DIR}/" not in lines:
            listed.write_text("\n".join(lines + [f"/{SECRETS_DIR}/"]) + "\n")
    path = root / KEY_FILE
    descriptor = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"origin": signer.name, "private_key_pem": signer.pem().decode()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path.with_suffix(".tmp"), path)
    return signer


def read_verifier(root: Path) -> Verifier:
    path = Path(root) / LOG_DIR / "log.pub"
    return parse_vkey(path.read_text(), str(path))


# --- the log -----------------------------------------------------------------------------------------

@dataclass
class LogCheck:
    """``ledger verify``'s findings on the Merkle log: what is wrong, and what is only pending."""

    size: int = 0
    head_size: int | None = None
    problems: list[str] = field(default_factory=list)
    pending: int = 0  # ledger entries not logged yet (the next sync logs them)

    def lines(self) -> list[str]:
        head = f"signed head at size {self.head_size}" if self.head_size is not None else "no signed head yet"
        out = [f"Merkle log {LOG_DIR}: {self.size} leaves, {head}"]
        out += [f"Merkle log: {problem}" for problem in self.problems]
        if self.pending:
            out.append(f"Merkle log: {self.pending} ledger entries not logged yet (the next batch, `fedunlearn "
                       "receipt` or `ledger prove-consistency` logs them)")
        return out


class TransparencyLog:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.directory = self.root / LOG_DIR

    @property
    def leaves_path(self) -> Path:
        return self.directory / "leaves.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.directory / "checkpoint"

    def torn_tail(self) -> int:
        """The length of a last line without its newline: an append cut off by a crash. No head
        can cover it (heads are signed after the append returns), so it is dropped, not damage."""
        data = self.leaves_path.read_bytes() if self.leaves_path.is_file() else b""
        return 0 if not data or data.endswith(b"\n") else len(data) - (data.rfind(b"\n") + 1)

    def records(self) -> list[LeafRecord]:
        if not self.leaves_path.is_file():
            return []
        records = []
        text = self.leaves_path.read_text()
        lines = text.splitlines()[:-1] if self.torn_tail() else text.splitlines()
        for number, raw in enumerate(lines, start=1):
            try:
                record = LeafRecord.parse(raw)
            except (ValueError, KeyError, TypeError) as err:
                raise LogRewritten(f"{self.leaves_path} line {number} is not a leaf record ({err}); nothing was "
                                   "signed. Restore data/transparency/ from the DVC remote (`fedunlearn restore`)") \
                    from None
            if record.index != len(records):
                raise LogRewritten(f"{self.leaves_path} line {number} holds leaf {record.index}, not leaf "
                                   f"{len(records)}: leaves were removed or reordered; nothing was signed")
            records.append(record)
        return records

    def head(self) -> str | None:
        """The latest signed tree head (a signed note), if any."""
        return self.checkpoint_path.read_text() if self.checkpoint_path.is_file() else None

    def heads(self) -> dict[int, str]:
        """Every tree head ever signed, by size."""
        found = {}
        for path in self.directory.glob("head-*.checkpoint"):
            size = path.name[len("head-"):-len(".checkpoint")]
            if size.isdigit():
                found[int(size)] = path.read_text()
        return found

    def _lock(self) -> FileLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.directory / ".lock"))

    def sync(self, entries: list[LedgerEntry], receipts: list[Receipt], model_hash: ModelHash | None = None,
             published: Iterable[tuple[str, str]] = (), backing: Backing | None = None) -> list[LeafRecord]:
        """Log what the ledger, the receipts and the registry (``backing.versions``: retirements,
        holds) hold and the log does not yet, and sign a head over it; returns the leaves appended.
        Raises ``LogRewritten`` (and writes nothing) when the ledger or the log no longer reads as
        the history every head signed here or ``published`` (source, signed note: the copies on the
        DVC remote and in MLflow) commits to, or when a leaf is backed by no record (``backing``)."""
        signer, made = load_signer(self.root)
        backing = backing or backing_of(receipts)
        with self._lock():
            records = self.records()
            _check_prefix(records, entries)
            self._check_backed(records, backing)
            new = _pending(records, entries, receipts, model_hash, backing)
            if self.torn_tail():  # the cut-off append is dropped only once nothing is refused
                with open(self.leaves_path, "r+b") as handle:
                    handle.truncate(self.leaves_path.stat().st_size - self.torn_tail())
            self._check_heads(records + new, signer.verifier, list(published))  # before anything is written
            if made:
                _write_key(self.root, signer)
            write_public(self.root, signer)
            if new:
                append_lines_durable(self.leaves_path, [record.line() for record in new])
            records += new
            head = self.head()
            if new or head is None or Checkpoint.parse(split_note(head, "head")[0], "head").size != len(records):
                self._sign(records, signer)
        return new

    def _check_backed(self, records: list[LeafRecord], backing: Backing) -> None:
        unbacked = unbacked_leaves(records, backing)
        if unbacked:
            head = self.head()
            size = Checkpoint.parse(split_note(head, "head")[0], "head").size if head else 0
            covered = [u for u in unbacked if u.index < size]
            fix = (f"a signed head covers leaf {covered[0].index}: restore data/transparency/ from the DVC remote "
                   "(`fedunlearn restore`), or start a new log (`fedunlearn ledger new-log`)" if covered else
                   f"no signed head covers it: remove the line of leaf {unbacked[0].index} (and those after it) from "
                   f"{LOG_DIR / 'leaves.jsonl'}, or restore data/transparency/ from the DVC remote (`fedunlearn "
                   "restore`)")
            raise LogRewritten(f"{LOG_DIR / 'leaves.jsonl'}: {unbacked[0].line()}"
                               + (f" (and {len(unbacked) - 1} more)" if len(unbacked) > 1 else "")
                               + f"; nothing was signed. Fix: {fix}")

    def append_statements(self, statements: list[tuple[str, str, bytes]]) -> None:
        """Append leaves as they are (kind, key, bytes) and sign: for tests that play a dishonest
        operator, and for statements a later issue adds. Checks nothing."""
        signer = ensure_key(self.root)
        with self._lock():
            records = self.records()
            new = [LeafRecord(len(records) + i, kind, key, leaf) for i, (kind, key, leaf) in enumerate(statements)]
            append_lines_durable(self.leaves_path, [record.line() for record in new])
            self._sign(records + new, signer)

    def _check_heads(self, records: list[LeafRecord], verifier: Verifier, published: list[tuple[str, str]]) -> None:
        """Every head on file and every published one of this log's origin must commit to a prefix
        of the leaves: a leaves file lost or rebuilt (new salts, new roots), or a ledger entry
        dropped and chained anew, is then refused, not signed anew. A published head of another
        origin binds too, unless `ledger new-log` retired that origin."""
        problems = _heads_problems(self.notes(published, verifier.name), records, verifier)
        if problems:
            raise LogRewritten(f"{problems[0]}; nothing was signed. Restore data/transparency/ and the ledger from the "
                               "DVC remote (`fedunlearn restore`) and .secrets/transparency-log.json from your backup; "
                               "if the history was changed on purpose, `fedunlearn ledger new-log` starts a new log "
                               "under a new origin (old receipts then visibly no longer extend to it)")

    def notes(self, published: list[tuple[str, str]], origin: str) -> list[tuple[str, str]]:
        """(source, signed note) of every head that binds the log: those on file and the published
        ones, but for those of origins retired by `ledger new-log`."""
        found = [(f"{LOG_DIR}/head-{size}.checkpoint", note) for size, note in sorted(self.heads().items())]
        found += [(f"{LOG_DIR}/checkpoint", self.head())] if self.head() is not None else []
        retired = self.retired_origins() - {origin}
        return found + [(source, note) for source, note in published if _origin(note, source) not in retired]

    def retired_origins(self) -> set[str]:
        """Origins `ledger new-log` (or `ledger repair --new-log`) gave up in this workspace."""
        listed = self.directory / RETIRED_ORIGINS
        names = set(listed.read_text().split()) if listed.is_file() else set()
        for path in self.directory.glob("retired-*-log.pub"):  # logs retired before the list was kept
            names.add(path.read_text().strip().split("+", 1)[0])
        return names

    def _sign(self, records: list[LeafRecord], signer: Signer) -> str:
        checkpoint = Checkpoint(signer.name, len(records), merkle.root([r.hash for r in records]))
        note = signer.sign_note(checkpoint.text())
        write_text_atomic(self.directory / f"head-{checkpoint.size}.checkpoint", note)
        write_text_atomic(self.checkpoint_path, note)
        return note

    def check(self, entries: list[LedgerEntry], published: Iterable[tuple[str, str]] = (),
              backing: Backing | None = None) -> LogCheck:
        """The log against the ledger's hash chain, its own signed heads and the ``published``
        ones (source, signed note), and with ``backing`` every leaf against its record; changes
        nothing."""
        found = LogCheck()
        try:
            records = self.records()
            verifier = read_verifier(self.root) if (self.directory / "log.pub").is_file() else None
        except Exception as err:  # a damaged leaves file or key: reported, the rest cannot be checked
            found.problems.append(str(err))
            return found
        found.size = len(records)
        found.problems += _ledger_problems(records, entries)
        if backing is not None:
            found.problems += [u.line() for u in unbacked_leaves(records, backing)]
        logged = sum(1 for r in records if r.kind == "deletion")
        found.pending = max(0, len(entries) - logged) if not found.problems else 0
        if verifier is None:
            if records or published:
                found.problems.append(f"{LOG_DIR / 'log.pub'} is missing: no head can be checked")
            return found
        found.problems += _heads_problems(self.notes(list(published), verifier.name), records, verifier)
        head = self.head()
        if head is not None and not found.problems:
            found.head_size = Checkpoint.parse(split_note(head, "head")[0], "head").size
        return found

    def start_new_log(self, entries: list[LedgerEntry], receipts: list[Receipt], model_hash: ModelHash | None = None,
                      published: Iterable[tuple[str, str]] = (), backing: Backing | None = None) -> tuple[str, str]:
        """On an operator's explicit request (`ledger new-log`, `ledger repair --new-log`): the old
        log's files are kept as ``retired-<n>-*``, its origin and those of every published head are
        listed as retired, and a new log under a new origin (so that no old receipt can be shown to
        extend to it) is built and signed. A lost key is replaced here, and only here. Returns
        (old, new) origin."""
        published = list(published)
        try:
            old = load_signer(self.root)[0]
        except LogRewritten:  # the key is lost: the new log gets a new one
            old = None
        with self._lock():
            generation = 1 + sum(1 for _ in self.directory.glob("retired-*-log.pub"))
            for path in [self.leaves_path, self.checkpoint_path, self.directory / "log.pub",
                         *self.directory.glob("head-*.checkpoint")]:
                if path.is_file():
                    os.replace(path, self.directory / f"retired-{generation}-{path.name}")
            retired = ({_origin(note, source) for source, note in published} | {old.name if old else None}) - {None}
            with open(self.directory / RETIRED_ORIGINS, "a") as handle:
                handle.write("".join(f"{name}\n" for name in sorted(retired)))
            name = _next_origin(old.name if old else new_origin(), retired)
            renamed = _write_key(self.root, Signer(name, old.private) if old else Signer.generate(name))
        self.sync(entries, receipts, model_hash, published, backing)
        return (old.name if old else "(key lost)"), renamed.name


def _next_origin(name: str, taken: set[str]) -> str:
    """``<base>/generation-<n+1>`` (the first log is generation 1), past every origin already used."""
    base, _, number = name.partition("/generation-")
    generation = int(number) + 1 if number.isdigit() else 2
    while f"{base}/generation-{generation}" in taken:
        generation += 1
    return f"{base}/generation-{generation}"


def _origin(note: str | None, source: str) -> str | None:
    """The origin a signed head names (None: it does not read as one; checking it says why)."""
    try:
        return Checkpoint.parse(split_note(note, source)[0], source).origin
    except ReceiptMalformed:
        return None


def _heads_problems(notes: list[tuple[str, str]], records: list[LeafRecord], verifier: Verifier) -> list[str]:
    """Why each signed head does not commit to a prefix of ``records``, the roots computed once."""
    sizes = []
    for source, note in notes:
        try:
            sizes.append(Checkpoint.parse(split_note(note, source)[0], source).size)
        except ReceiptMalformed:
            pass  # _head_problem names it
    roots = merkle.prefix_roots([r.hash for r in records], sizes)
    return [problem for source, note in notes if (problem := _head_problem(note, records, verifier, source, roots))]


def _head_problem(note: str, records: list[LeafRecord], verifier: Verifier | None, source: str,
                  roots: dict[int, bytes] | None = None) -> str | None:
    """Why a signed head does not commit to a prefix of ``records`` (None: it does)."""
    try:
        checkpoint = open_checkpoint(note, verifier, source)
    except Exception as err:  # ReceiptMalformed, SignatureInvalid: the message names the file
        return str(err)
    if checkpoint.size > len(records):
        return (f"{source} was signed over {checkpoint.size} leaves and the log holds {len(records)}: leaves were "
                "removed")
    root = (roots or {}).get(checkpoint.size) or merkle.root([r.hash for r in records[:checkpoint.size]])
    if root != checkpoint.root:
        return (f"{source} (size {checkpoint.size}) does not match the log's first {checkpoint.size} leaves: "
                "leaves were changed, removed or reordered after it was signed")
    return None


def _check_prefix(records: list[LeafRecord], entries: list[LedgerEntry]) -> None:
    problems = _ledger_problems(records, entries)
    if problems:
        raise LogRewritten(f"the deletion ledger no longer reads as the history the Merkle log holds "
                           f"({'; '.join(problems[:3])}); nothing was signed. Restore the ledger "
                           "(`fedunlearn ledger repair` restores entries from the batch records), or, if the "
                           "ledger was rewritten on purpose, `fedunlearn ledger repair --new-log`")


def _ledger_problems(records: list[LeafRecord], entries: list[LedgerEntry]) -> list[str]:
    """Each logged deletion must be the ledger entry at the same position, unchanged: the ledger
    may only have grown since it was logged."""
    logged = [r for r in records if r.kind == "deletion"]
    where = {entry.request_id: position for position, entry in enumerate(entries)}
    problems = []
    for position, record in enumerate(logged):
        entry = entries[position] if position < len(entries) else None
        try:
            statement = record.statement
        except ValueError:  # its bytes were changed: no head can match it either
            problems.append(f"leaf {record.index} (deletion {record.key}) is not a JSON statement: its bytes were "
                            "changed")
            continue
        if not isinstance(statement, dict):
            problems.append(f"leaf {record.index} (deletion {record.key}) is not a statement")
            continue
        if record.key not in where:
            problems.append(f"leaf {record.index} logs request {record.key} as ledger entry {position + 1}, and the "
                            "ledger no longer holds it (the entry was removed)")
        elif entry is None or entry.request_id != record.key:
            problems.append(f"leaf {record.index} logs request {record.key} as ledger entry {position + 1}, and the "
                            f"ledger holds it as entry {where[record.key] + 1} (entries were reordered)")
        elif not _same_entry(record, statement, entry):
            problems.append(f"leaf {record.index} commits to another version of request {record.key}'s ledger "
                            "entry (the entry was changed)")
        elif record.salt is None or statement.get("ids_commitment") != ids_commitment(
                record.salt, set(entry.sample_ids) | set(entry.merged_ids), statement.get("type")):
            problems.append(f"leaf {record.index}: request {record.key}'s sample IDs no longer match their "
                            "commitment")
    return problems


def _same_entry(record: LeafRecord, statement: dict[str, Any], entry: LedgerEntry) -> bool:
    """Whether the leaf commits to this version of the entry: v1 leaves hold its checksum bare,
    v2 leaves keyed by the request's salt."""
    if statement.get("request_id") != record.key:
        return False
    if statement.get("type") == DELETION_V1:
        return statement.get("ledger_checksum") == entry_checksum(entry)
    return record.salt is not None and statement.get("ledger_commitment") == ledger_commitment(
        record.salt, entry_checksum(entry))


def _pending(records: list[LeafRecord], entries: list[LedgerEntry], receipts: list[Receipt],
             model_hash: ModelHash | None, backing: Backing | None = None) -> list[LeafRecord]:
    """The leaves the ledger, receipts and registry call for that the log lacks, in the order they
    happened: ledger entries first, then each receipt whose requests are all logged, then exact
    forgetting, then the retirements and holds the registry holds (``backing.versions``). A receipt
    without its batch record is not logged: no record would back its statements."""
    logged = {r.key for r in records if r.kind == "deletion"}
    batches = {r.key for r in records if r.kind == "batch"}
    exact = {r.key for r in records if r.kind == "exact"}
    new: list[LeafRecord] = []

    def add(kind: str, key: str, leaf: bytes, salt: bytes | None = None) -> None:
        new.append(LeafRecord(len(records) + len(new), kind, key, leaf, salt))

    for entry in entries[sum(1 for r in records if r.kind == "deletion"):]:
        salt = secrets.token_bytes(32)
        add("deletion", entry.request_id, deletion_leaf(entry, salt), salt)
        logged.add(entry.request_id)
    for receipt in sorted(receipts, key=lambda r: r.created_at):
        recorded = backing is None or receipt.batch_id in backing.batch_records  # else it would be refused
        if receipt.batch_id not in batches and receipt.request_ids and set(receipt.request_ids) <= logged and recorded:
            add("batch", receipt.batch_id, batch_leaf(receipt, model_hash))
            batches.add(receipt.batch_id)
        if receipt.exactly_forgotten is not None and receipt.batch_id in batches and receipt.batch_id not in exact:
            add("exact", receipt.batch_id, exact_leaf(receipt, model_hash))
            exact.add(receipt.batch_id)
    for kind, key, leaf in version_statements(records, backing.versions if backing else None):
        add(kind, key, leaf)
    return new


def all_receipts(root: Path) -> list[Receipt]:
    """Every batch receipt of the workspace, of every scenario; one that does not read back is
    damage, named by its path (``StateDamaged``): no statement can be checked against it, so nothing
    is signed."""
    from fedunlearn.requests.folders import RECEIPTS_DIR

    return [load_receipt(p) for p in sorted((Path(root) / RECEIPTS_DIR).glob("*.json"))]


def backing_of(receipts: list[Receipt], batch_records: Iterable[str] | None = None, versions=None,
               digest=None) -> Backing:
    """The records the leaves are checked against; without ``batch_records``, the receipts' own."""
    found = {r.batch_id: r for r in receipts}
    return Backing(found, frozenset(found if batch_records is None else batch_records), versions, digest)


def sync_workspace(root: Path, model_hash: ModelHash | None = None, published: Iterable[tuple[str, str]] = (),
                   backing: Backing | None = None) -> TransparencyLog:
    """The workspace's log brought up to date with its ledger, receipts and (``backing``) registry,
    and signed once it extends every head signed here and every ``published`` one and every leaf
    is backed by its record (``stores.transparency``)."""
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger

    log = TransparencyLog(root)
    log.sync(Ledger(Path(root) / LEDGER_PATH).entries(), all_receipts(root), model_hash, published, backing)
    return log

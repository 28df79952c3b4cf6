"""``fedunlearn receipt``, ``fedunlearn verify-receipt`` and ``fedunlearn ledger prove-consistency``:
receipts a data subject verifies alone, against the ledger's Merkle log (fedunlearn.transparency;
docs/requests-and-ledger.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NoReturn

VERIFY_EPILOG = ("exit status: 0 verified; 10 the file (or OLD, or the key, or IDS) is not a receipt, tree head, key "
                 "or ID list this command reads (too large, not UTF-8, CRLF or NUL, a number or base64 field not in "
                 "canonical form, the signed-note or tlog-proof grammar broken), or carries no consistency proof for "
                 "OLD; 11 the tree head is not signed by KEY, or KEY is not the --key-id pinned; 12 the entry (or a "
                 "statement, or the IDs given) is not in the signed log; 13 OLD's log is not a prefix of FILE's: the "
                 "log was rewritten; 2 a file cannot be read")


def register(sub: argparse._SubParsersAction) -> None:
    receipt = sub.add_parser("receipt", help="write the receipt of an applied deletion request for its data subject",
                             description="Log what the ledger and the batch receipts hold that the Merkle log does "
                                         "not yet, sign a tree head (once the log extends every head published to "
                                         "the DVC remote and MLflow), and write REQUEST_ID's receipt: its leaf (a "
                                         "salted commitment to its sample IDs, the salt included: the file tells "
                                         "those IDs to whoever holds it), the batch's statements, their inclusion "
                                         "proofs and the signed head (C2SP tlog-proof).")
    receipt.add_argument("request_id", metavar="REQUEST_ID", help="the request's ID, as `fedunlearn request` printed it")
    receipt.add_argument("--out", required=True, type=Path, metavar="FILE",
                         help="where to write the receipt: a new file (never a link or a directory)")
    receipt.add_argument("--force", action="store_true", help="replace FILE if it exists")
    receipt.set_defaults(handler=run_receipt)

    verify = sub.add_parser("verify-receipt", help="verify a receipt with the log's public key alone (no workspace)",
                            description="Check the tree head's signature, the inclusion of the request's leaf and "
                                        "of the batch's statements and, with --since, that the log OLD saw is a "
                                        "prefix of the log FILE's head signs. Prints the key ID it verified against.",
                            epilog=VERIFY_EPILOG)
    verify.add_argument("file", type=Path, metavar="FILE", help="the receipt (`fedunlearn receipt --out FILE` wrote it)")
    verify.add_argument("--public-key", required=True, type=Path, metavar="KEY",
                        help="the log's verifier key (data/transparency/log.pub of the operator's workspace)")
    verify.add_argument("--key-id", metavar="HEX", help="the key ID (8 hex digits) you were given for the log, "
                                                        "apart from KEY: a KEY with another ID is refused (status 11)")
    verify.add_argument("--since", type=Path, metavar="OLD", help="a receipt or signed tree head kept from before")
    verify.add_argument("--ids", type=Path, metavar="IDS",
                        help="a file of your sample IDs, separated by whitespace or commas as `fedunlearn request` "
                             "reads them (repeats count once): checked against the salted commitment")
    verify.set_defaults(handler=run_verify_receipt, needs_workspace=False)


def register_ledger_actions(actions: argparse._SubParsersAction) -> None:
    """``ledger prove-consistency`` and ``ledger new-log`` (called by ``cli.ledger.register``)."""
    prove = actions.add_parser("prove-consistency", help="prove today's log an extension of the one a receipt or "
                                                         "tree head saw (or refuse: it is not)",
                               description="Write a receipt against today's signed head that carries the "
                                           "consistency proof from OLD's head and the subject's inclusion proof.")
    prove.add_argument("--since", required=True, type=Path, metavar="OLD", help="the receipt or tree head kept")
    prove.add_argument("--out", required=True, type=Path, metavar="FILE",
                       help="where to write the proof: a new file (never a link or a directory)")
    prove.add_argument("--force", action="store_true", help="replace FILE if it exists")
    prove.add_argument("--request", metavar="REQUEST_ID", help="whose receipt, when OLD is a bare tree head (without "
                                                               "it: a proof about the log alone, for a witness, which "
                                                               "names no entry)")
    prove.set_defaults(handler=run_prove_consistency)
    new_log = actions.add_parser("new-log", help="retire the Merkle log and start a new one under a new origin "
                                                 "(old receipts visibly stop extending to it)",
                                 description="For a log that cannot be restored (data/transparency/ or the signing "
                                             "key lost, history changed on purpose): the old log's files are kept "
                                             "as data/transparency/retired-<n>-*, its origin and those of the heads "
                                             "published to the DVC remote and MLflow are listed as retired, and a "
                                             "new log is signed and published under a new origin.")
    new_log.set_defaults(handler=run_new_log)


def _check_out(path: Path, force: bool) -> None:
    """Before anything is signed: FILE must be a new path, or with --force a regular file; a link
    is never followed and a directory is never written into."""
    from fedunlearn.errors import InputError

    if path.is_symlink():
        raise InputError(f"--out {path} is a symbolic link, which is never followed: give the path of a new file")
    if path.is_dir():
        raise InputError(f"--out {path} is a directory: give a file path, e.g. {path / 'receipt.tlog-proof'}")
    if path.exists() and not force:
        raise InputError(f"--out {path} exists and was left as it is: give a new path, or pass --force to replace it")
    if path.exists() and not path.is_file():
        raise InputError(f"--out {path} is not a regular file: give the path of a new file")


def _write_out(path: Path, text: str, force: bool) -> None:
    """Written whole or not at all: a new file is created exclusively (no link followed, nothing
    overwritten); --force replaces FILE by a renamed temporary file, never writing through a link."""
    import os
    import secrets

    from fedunlearn.errors import InputError

    _check_out(path, force)
    target = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp") if force else path
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(target, flags, 0o644)
    except FileExistsError:
        if path.parent.is_dir():
            raise InputError(f"--out {path} appeared while the file was made and was left as it is: give a new "
                             "path, or pass --force") from None
        _out_failed(path, NotADirectoryError(20, "a part of its directory is not a directory"))
    except OSError as err:
        _out_failed(path, err)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if force:
            os.replace(target, path)
    except OSError as err:
        target.unlink(missing_ok=True)  # not half a receipt
        _out_failed(path, err)


def _out_failed(path: Path, err: OSError) -> NoReturn:
    """Raise the one-line error for an --out FILE that could not be written: its own filesystem full
    (NoSpace, naming FILE, not the workspace), or another reason (InputError)."""
    import errno

    from fedunlearn.errors import InputError, NoSpace

    why = err.strerror or err.__class__.__name__
    if err.errno == errno.ENOSPC:  # caused by an error naming FILE, so that the report names FILE, not the workspace
        raise NoSpace(f"--out {path}: no space left on the filesystem of {path.parent}; nothing was written there. "
                      "Free space on it or give a path on another filesystem, then run the command again") \
            from OSError(errno.ENOSPC, why, str(path))
    raise InputError(f"--out {path} cannot be written ({why}): give the path of a new file in a writable "
                     "directory") from None


def _published(root: Path):
    from stores.transparency import published_heads

    return published_heads(root)


def refuse_quarantined(root: Path, request_id: str) -> None:
    """A request with no receipt because a batch quarantined it: say so, and why."""
    from fedunlearn.errors import InputError
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import REASON_SUFFIX, read_quarantined

    folders = RequestFolders(root)
    found = next((q for q in read_quarantined(folders) if q.request_id == request_id), None)
    if found is not None:
        reason = folders.quarantine / f"{found.name}{REASON_SUFFIX}"
        raise InputError(f"request {request_id} was quarantined, never applied, so it has no receipt: {found.reason} "
                         f"({reason}); fix it and submit it again (`fedunlearn status` lists quarantined requests)")


def refuse_batch(root: Path, batch_id: str, out: Path) -> None:
    """A batch ID given for a request's: say it is one, and name its requests, each with the command
    that writes its receipt (a receipt is a data subject's, one per request: it holds that request's salt)."""
    from fedunlearn.errors import InputError
    from fedunlearn.receipts import read_receipt
    from fedunlearn.requests.folders import RequestFolders

    receipt, journal = read_receipt(root, batch_id), RequestFolders(root).batches / f"{batch_id}.json"
    if receipt is None and not journal.is_file():
        return
    requests = receipt.request_ids if receipt is not None else [
        entry["request_id"] for entry in json.loads(journal.read_text()).get("requests", [])]
    listed = "; ".join(f"`fedunlearn receipt {r} --out {out.with_name(f'{r}.tlog-proof')}`" for r in requests)
    raise InputError(f"{batch_id} is a deletion batch, not a request: a receipt is one data subject's, one per "
                     f"request. The batch applied {len(requests)} request(s); write each one's receipt with "
                     f"{listed or 'none (the batch has no request)'}; the batch's own receipt is "
                     f"data/receipts/{batch_id}.json")


def run_receipt(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.errors import InputError
    from fedunlearn.transparency.log import read_verifier
    from fedunlearn.transparency.proofs import build_receipt, verify_receipt
    from stores.transparency import signed_log

    _check_out(args.out, args.force)
    log = signed_log(root)
    try:
        text = build_receipt(log, args.request_id)
    except InputError:
        refuse_quarantined(root, args.request_id)
        refuse_batch(root, args.request_id, args.out)
        raise
    _write_out(args.out, text, args.force)
    print("\n".join(verify_receipt(text, read_verifier(root), str(args.out))))
    print(f"wrote {args.out}; hand it to the data subject with {log.directory / 'log.pub'}. It holds the salt of "
          "the commitment, so it tells the request's sample IDs to whoever holds it: send it only to the subject")
    return 0


def run_verify_receipt(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.errors import FedunlearnError
    from fedunlearn.transparency.failures import ReceiptMalformed

    try:
        lines = _verify(args)
    except (FedunlearnError, FileNotFoundError):
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError) as err:
        # A check this command lacks must still end in one line and status 10, not a traceback.
        raise ReceiptMalformed(f"{args.file} could not be read as a receipt ({err.__class__.__name__}); it is not a "
                               "file `fedunlearn receipt` wrote") from None
    print("\n".join(lines))
    print(f"VERIFIED: {args.file}")
    return 0


def _verify(args: argparse.Namespace) -> list[str]:
    """Only the pure verification modules: no torch, no orchestration package, no workspace."""
    from fedunlearn.transparency.failures import SignatureInvalid
    from fedunlearn.transparency.note import parse_vkey
    from fedunlearn.transparency.proofs import verify_receipt
    from fedunlearn.transparency.statements import split_ids
    from fedunlearn.transparency.untrusted import IDS_LIMIT, KEY_LIMIT, RECEIPT_LIMIT, read_text

    verifier = parse_vkey(read_text(args.public_key, "the public key", KEY_LIMIT), str(args.public_key))
    if args.key_id is not None:
        pinned = args.key_id.strip().lower()
        if pinned != verifier.key_id.hex():
            raise SignatureInvalid(f"{args.public_key} has key ID {verifier.key_id.hex()}, not the {pinned!r} pinned "
                                   "with --key-id: it is not the log's key you were given; ask the operator for the "
                                   "log's key through a channel apart from the receipt")
    kept = read_text(args.since, "a receipt or tree head", RECEIPT_LIMIT) if args.since else None
    ids = split_ids(read_text(args.ids, "an ID list", IDS_LIMIT, allow_whitespace=True)) if args.ids else None
    return verify_receipt(read_text(args.file, "a receipt", RECEIPT_LIMIT), verifier, str(args.file), kept,
                          str(args.since or ""), ids)


def run_prove_consistency(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.transparency.proofs import prove_consistency
    from fedunlearn.transparency.untrusted import RECEIPT_LIMIT, read_text
    from stores.transparency import signed_log

    kept = read_text(args.since, "a receipt or tree head", RECEIPT_LIMIT)
    _check_out(args.out, args.force)
    log = signed_log(root)
    text = prove_consistency(log, kept, str(args.since), args.request)
    _write_out(args.out, text, args.force)
    print(f"wrote {args.out}: today's signed head, the consistency proof from {args.since} and the inclusion proof")
    return 0


def run_new_log(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
    from fedunlearn.transparency.log import TransparencyLog, all_receipts
    from stores.transparency import publish_tree_head, weights_sha256, workspace_backing

    published = _published(root)
    old, new = TransparencyLog(root).start_new_log(Ledger(root / LEDGER_PATH).entries(), all_receipts(root),
                                                   weights_sha256(root), published, workspace_backing(root))
    print(f"NEW MERKLE LOG: {new} replaces {old}; the old log's files are kept as data/transparency/retired-*. "
          "Receipts signed by the old log do not extend to the new one: tell their holders")
    print("\n".join(publish_tree_head(root).lines()))
    return 0


def log_check_lines(root: Path, entries) -> tuple[bool, list[str]]:
    """``ledger verify``'s lines on the Merkle log (against the published heads too), and whether it is intact."""
    from fedunlearn.transparency.failures import LogRewritten
    from fedunlearn.transparency.log import TransparencyLog
    from stores.transparency import workspace_backing

    try:
        published, unread = _published(root), []
    except LogRewritten as err:
        published, unread = [], [f"Merkle log: {err}"]
    try:
        backing = workspace_backing(root)
    except LogRewritten as err:  # a receipt that does not read back: the leaves about it cannot be checked
        backing, unread = None, unread + [f"Merkle log: {err}"]
    check = TransparencyLog(root).check(entries, published, backing)
    return not check.problems and not unread, check.lines() + unread


def after_repair(args: argparse.Namespace, root: Path) -> int | None:
    """After ``ledger repair``: log and sign what the repaired ledger holds — unless it rewrote
    logged history, which is never signed silently: refused, or with ``--new-log`` a new log under
    a new origin. Returns an exit status to stop with, or None to go on."""
    from fedunlearn.errors import StateDamaged
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
    from fedunlearn.transparency.failures import LogRewritten
    from fedunlearn.transparency.log import TransparencyLog, all_receipts, sync_workspace
    from stores.transparency import weights_sha256, workspace_backing

    published = _published(root)
    try:
        sync_workspace(root, weights_sha256(root), published, workspace_backing(root))
        return None
    except LogRewritten as err:
        if not getattr(args, "new_log", False):
            print(f"Merkle log NOT signed: {err}")
            return StateDamaged.exit_code
    old, new = TransparencyLog(root).start_new_log(Ledger(root / LEDGER_PATH).entries(), all_receipts(root),
                                                   weights_sha256(root), published, workspace_backing(root))
    print(f"NEW MERKLE LOG: {new} replaces {old}; the old log's files are kept as data/transparency/retired-*. "
          "Receipts signed by the old log do not extend to the new one: tell their holders")
    return None

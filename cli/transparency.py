"""``fedunlearn receipt``, ``fedunlearn verify-receipt`` and ``fedunlearn ledger prove-consistency``:
receipts a data subject verifies alone, against the ledger's Merkle log (fedunlearn.transparency;
docs/requests-and-ledger.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

VERIFY_EPILOG = ("exit status: 0 verified; 10 the file (or OLD, or the key) is not a receipt, tree head or key this "
                 "command reads, or carries no consistency proof for OLD; 11 the tree head is not signed by KEY; 12 "
                 "the entry (or a statement, or the IDs given) is not in the signed log; 13 OLD's log is not a prefix "
                 "of FILE's: the log was rewritten; 2 a file cannot be read")


def register(sub: argparse._SubParsersAction) -> None:
    receipt = sub.add_parser("receipt", help="write the receipt of an applied deletion request for its data subject",
                             description="Log what the ledger and the batch receipts hold that the Merkle log does "
                                         "not yet, sign a tree head, and write REQUEST_ID's receipt: its leaf (a "
                                         "salted commitment to its sample IDs, the salt included), the batch's "
                                         "statements, their inclusion proofs and the signed head (C2SP tlog-proof).")
    receipt.add_argument("request_id", metavar="REQUEST_ID")
    receipt.add_argument("--out", required=True, type=Path, metavar="FILE", help="where to write the receipt")
    receipt.set_defaults(handler=run_receipt)

    verify = sub.add_parser("verify-receipt", help="verify a receipt with the log's public key alone (no workspace)",
                            description="Check the tree head's signature, the inclusion of the request's leaf and "
                                        "of the batch's statements and, with --since, that the log OLD saw is a "
                                        "prefix of the log FILE's head signs.", epilog=VERIFY_EPILOG)
    verify.add_argument("file", type=Path, metavar="FILE")
    verify.add_argument("--public-key", required=True, type=Path, metavar="KEY",
                        help="the log's verifier key (data/transparency/log.pub of the operator's workspace)")
    verify.add_argument("--since", type=Path, metavar="OLD", help="a receipt or signed tree head kept from before")
    verify.add_argument("--ids", type=Path, metavar="IDS",
                        help="a file of your sample IDs, one per line: checked against the salted commitment")
    verify.set_defaults(handler=run_verify_receipt, needs_workspace=False)


def register_ledger_actions(actions: argparse._SubParsersAction) -> None:
    """``ledger prove-consistency`` (called by ``cli.ledger.register``)."""
    prove = actions.add_parser("prove-consistency", help="prove today's log an extension of the one a receipt or "
                                                         "tree head saw (or refuse: it is not)",
                               description="Write a receipt against today's signed head that carries the "
                                           "consistency proof from OLD's head and the subject's inclusion proof.")
    prove.add_argument("--since", required=True, type=Path, metavar="OLD", help="the receipt or tree head kept")
    prove.add_argument("--out", required=True, type=Path, metavar="FILE")
    prove.add_argument("--request", metavar="REQUEST_ID", help="whose receipt, when OLD is a bare tree head (without "
                                                               "it: a proof about the log alone, for a witness)")
    prove.set_defaults(handler=run_prove_consistency)


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise FileNotFoundError(f"cannot read {what} {path} ({err.__class__.__name__}); give the path of the file "
                                "as it was handed to you") from None


def run_receipt(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.transparency.log import read_verifier, sync_workspace
    from fedunlearn.transparency.proofs import build_receipt, verify_receipt
    from stores.transparency import weights_sha256

    log = sync_workspace(root, weights_sha256(root))
    text = build_receipt(log, args.request_id)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print("\n".join(verify_receipt(text, read_verifier(root), str(args.out))))
    print(f"wrote {args.out}; hand it to the data subject with {log.directory / 'log.pub'}")
    return 0


def run_verify_receipt(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.transparency.note import parse_vkey
    from fedunlearn.transparency.proofs import verify_receipt

    verifier = parse_vkey(_read(args.public_key, "the public key"), str(args.public_key))
    kept = _read(args.since, "the receipt or tree head") if args.since else None
    ids = _read(args.ids, "the sample IDs").split() if args.ids else None
    lines = verify_receipt(_read(args.file, "the receipt"), verifier, str(args.file), kept, str(args.since or ""),
                           ids)
    print("\n".join(lines))
    print(f"VERIFIED: {args.file}")
    return 0


def run_prove_consistency(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.transparency.log import sync_workspace
    from fedunlearn.transparency.proofs import prove_consistency
    from stores.transparency import weights_sha256

    log = sync_workspace(root, weights_sha256(root))
    text = prove_consistency(log, _read(args.since, "the receipt or tree head"), str(args.since), args.request)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: today's signed head, the consistency proof from {args.since} and the inclusion proof")
    return 0


def log_check_lines(root: Path, entries) -> tuple[bool, list[str]]:
    """``ledger verify``'s lines on the Merkle log, and whether it is intact."""
    from fedunlearn.transparency.log import TransparencyLog

    check = TransparencyLog(root).check(entries)
    return not check.problems, check.lines()


def after_repair(args: argparse.Namespace, root: Path) -> int | None:
    """After ``ledger repair``: log and sign what the repaired ledger holds — unless it rewrote
    logged history, which is never signed silently: refused, or with ``--new-log`` a new log under
    a new origin. Returns an exit status to stop with, or None to go on."""
    from fedunlearn.errors import StateDamaged
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
    from fedunlearn.transparency.failures import LogRewritten
    from fedunlearn.transparency.log import TransparencyLog, all_receipts, sync_workspace
    from stores.transparency import weights_sha256

    try:
        sync_workspace(root, weights_sha256(root))
        return None
    except LogRewritten as err:
        if not getattr(args, "new_log", False):
            print(f"Merkle log NOT signed: {err}")
            return StateDamaged.exit_code
    old, new = TransparencyLog(root).start_new_log(Ledger(root / LEDGER_PATH).entries(), all_receipts(root),
                                                   weights_sha256(root))
    print(f"NEW MERKLE LOG: {new} replaces {old}; the old log's files are kept as data/transparency/retired-*. "
          "Receipts signed by the old log do not extend to the new one: tell their holders")
    return None

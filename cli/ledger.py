"""``fedunlearn ledger verify`` and ``fedunlearn ledger repair``: the deletion ledger checked
against the batch records (checksums, hash chain, every journaled append present) and restored
from them."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    ledger = sub.add_parser("ledger", help="check or repair the deletion ledger against the batch records",
                            description="The deletion ledger (data/ledger/ledger.jsonl) chains its entries by "
                                        "checksum; the batch records hold each batch's entries as written.")
    actions = ledger.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = actions.add_parser("verify", help="check every entry's checksum and link, that every journaled "
                                               "append is in the ledger, that no processed request, receipt, data "
                                               "version or registered batch shows a request applied that the ledger "
                                               "lacks, and that every batch in the ledger has its record (exit "
                                               "status 4 when damaged)")
    verify.set_defaults(handler=run_verify)
    repair = actions.add_parser("repair", help="restore missing or changed entries from the batch records (or, "
                                               "when no record holds them, from the processed request files and "
                                               "receipts), drop a torn last line of an append that never returned, "
                                               "rebuild damaged or missing batch records; the old ledger is kept as "
                                               "a backup")
    repair.add_argument("--new-log", action="store_true",
                        help="if the repaired ledger no longer reads as the history the Merkle log signed, start a new "
                             "log under a new origin (old receipts visibly stop extending to it) instead of refusing")
    repair.set_defaults(handler=run_repair)
    from cli.transparency import register_ledger_actions

    register_ledger_actions(actions)


def registry_batches(root: Path):
    """The batch IDs the workspace's registry tags versions with, read when a check must decide
    whether a torn line or a damaged record was applied (MLflow is imported only then)."""
    def read() -> set[str]:
        from stores.registry import registered_batch_ids

        return registered_batch_ids(root)

    return read


def run_verify(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.errors import StateDamaged
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.integrity import check_ledger
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger

    from cli.transparency import log_check_lines

    check = check_ledger(RequestFolders.create(root), Ledger(root / LEDGER_PATH), registry_batches(root))
    log_intact, log_lines = log_check_lines(root, check.inspection.entries)
    *lines, verdict = check.lines()  # the verdict stays the last line, and covers the Merkle log too
    if check.intact and not log_intact:
        verdict = ("DAMAGED: the Merkle log disagrees with the ledger or its signed heads: restore data/transparency/ "
                   "and the ledger from the DVC remote (`fedunlearn restore`), or see `fedunlearn ledger repair`")
    print("\n".join(lines + log_lines + [verdict]))
    return 0 if check.intact and log_intact else StateDamaged.exit_code


def run_repair(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.config import load_params
    from fedunlearn.receipts import RECEIPTS_DIR, load_receipt
    from fedunlearn.requests.catalog import source_resolver
    from fedunlearn.requests.folders import RequestFolders, batch_lock
    from fedunlearn.requests.integrity import repair_ledger
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger

    folders = RequestFolders.create(root)
    params = load_params(root / "params.yaml")
    datasets = {name: cfg.dataset for name, cfg in params.scenarios.items()}
    receipts = {}
    for path in sorted((root / RECEIPTS_DIR).glob("*.json")):
        receipt = load_receipt(path)
        receipts[receipt.batch_id] = (receipt.data_version_before, receipt.data_version_after)
    with batch_lock(folders, rerun="fedunlearn ledger repair"):
        report = repair_ledger(folders, Ledger(root / LEDGER_PATH), datasets, receipts, source_resolver(params),
                               registry_batches(root))
    print("\n".join(report.lines()))
    from cli.transparency import after_repair

    stopped = after_repair(args, root) if not report.unrepairable else None
    return stopped if stopped is not None else run_verify(args, root)

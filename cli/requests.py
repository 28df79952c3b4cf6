"""``fedunlearn request samples|client|class`` (submit a deletion request), ``fedunlearn ingest``
(apply the pending requests as one batch: validation, ledger, new data version, erasure check) and
``fedunlearn status`` (where the requests stand, their deadlines)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from cli.common import DEFAULT_SCENARIO

INBOX = "data/deletion_requests/inbox"


def register(sub: argparse._SubParsersAction) -> None:
    request = sub.add_parser("request", help="submit a deletion request to the inbox and print its ID",
                             description=f"Write one deletion request to {INBOX}/<request_id>.json and print its "
                                         "ID. `fedunlearn ingest` validates and applies it.")
    kinds = request.add_subparsers(dest="kind", required=True, metavar="KIND")
    samples = kinds.add_parser("samples", help="forget the listed samples",
                               description="Forget samples by ID (as printed by `fedunlearn ids`).")
    source = samples.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", nargs="+", metavar="ID", help="sample IDs (spaces or commas separate them)")
    source.add_argument("--ids-file", metavar="FILE", help="a file of sample IDs separated by whitespace or commas "
                                                           "('-' reads standard input)")
    client = kinds.add_parser("client", help="forget every sample of one client (HFL/DFL)",
                              description="Forget all training samples one client holds in the scenario's partition.")
    client.add_argument("--client", type=int, required=True, metavar="N",
                        help="the client's number in the scenario's partition: 0 to partition.num_clients - 1")
    label = kinds.add_parser("class", help="forget every training sample of one class",
                             description="Forget all training samples of a class (test samples stay, to measure "
                                         "the forgetting).")
    label.add_argument("--label", type=int, required=True, metavar="L", help="the class label, e.g. 3")
    for parser, kind in ((samples, "sample"), (client, "client"), (label, "class")):
        parser.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"default {DEFAULT_SCENARIO}")
        parser.add_argument("--reason", help="optional note kept with the request: one line of plain text, at most "
                                              "2000 characters")
        parser.add_argument("--deadline", metavar="ISO8601", help="when it must be forgotten by, an ISO 8601 time "
                            "after now, e.g. 2026-12-01T00:00Z (default: requests.deadline_days of params.yaml after "
                            "submission); a number, a time before now or one with no UTC form is refused (exit 2)")
        parser.set_defaults(handler=run_request, request_kind=kind)

    ingest = sub.add_parser("ingest", help="apply pending deletion requests: a new, verified data version",
                            description=f"Validate every request in {INBOX} (invalid ones go to quarantine/ with a "
                                        "reason), append the valid ones to the ledger as one batch, reproduce the "
                                        "data (a new DVC data version) and verify the deleted samples' bytes are "
                                        "gone. Re-running is safe: nothing is applied twice. No unlearning here.")
    ingest.add_argument("--scenario", default=DEFAULT_SCENARIO,
                        help=f"scenario to ingest requests for (and the default of files naming none; "
                             f"default {DEFAULT_SCENARIO})")
    ingest.add_argument("--purge", action="store_true",
                        help="after the batch, remove earlier data versions from the DVC cache (`dvc gc`) and "
                             "verify the cache too")
    ingest.set_defaults(handler=run_ingest)

    status = sub.add_parser("status", help="every request as pending / interim / exact with its deadline, the "
                                           "serving model, retrain debt",
                            description="Where the scenario's deletion requests stand: pending ones (inbox, or applied "
                                        "to the data by a batch not finished yet) with age and deadline, overdue ones "
                                        "first; interim ones (forgotten approximately, an exact retrain owed by their "
                                        "deadline) and exact ones; the serving version (alias current), its "
                                        "certificate and tier; the retrain debt and the next exact retrain scheduled "
                                        "(asked of the Prefect server in PREFECT_API_URL, which serves it); the "
                                        "requests a batch quarantined, with their reasons; the last batch and its "
                                        "verdict. "
                                        "Changes nothing. Exit status 9 when a request is not exactly forgotten by its "
                                        "deadline (pending or interim past it), for monitors; before that, a "
                                        "WARNING line (also on stderr) once the latest safe start of the exact "
                                        "retrain that repays the debt has passed. Each batch also "
                                        "publishes it as the Prefect artifact deletion-status-<scenario>.")
    status.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"default {DEFAULT_SCENARIO}")
    status.set_defaults(handler=run_status)

    register_rescan(sub)


def register_rescan(sub: argparse._SubParsersAction) -> None:
    rescan = sub.add_parser("rescan", help="read your source file again for the deleted rows it still holds",
                            description="Where a dataset's source is your system of record (system_of_record: "
                                        "true in params.yaml), a deletion batch names the rows to delete there and "
                                        "keeps their erasure pending. After you deleted them, this reads the source "
                                        "again (by ID and by row): each batch whose rows are gone is marked cleared "
                                        "in its receipt and the status artifact is published again. Exit status 6 "
                                        "while rows are still there (they are listed).")
    rescan.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"default {DEFAULT_SCENARIO}")
    rescan.set_defaults(handler=run_rescan)


def read_sample_ids(args: argparse.Namespace) -> list[str]:
    from fedunlearn.requests.model import MAX_REQUEST_BYTES
    from fedunlearn.user_files import read_capped, read_stream

    if args.ids is not None:
        return [i for i in re.split(r"[\s,]+", " ".join(args.ids)) if i]
    # No ID list larger than a whole request file may be (its JSON holds the IDs) can make one request.
    advice = "split the IDs into several requests"
    if args.ids_file == "-":
        data = read_stream(sys.stdin.buffer, "standard input", "the IDs of one request", MAX_REQUEST_BYTES, advice)
    else:
        if not Path(args.ids_file).is_file():
            raise FileNotFoundError(f"IDs file not found: {args.ids_file} (--ids-file takes a regular file, or - for "
                                    "standard input)")
        data = read_capped(args.ids_file, "the IDs of one request", MAX_REQUEST_BYTES, advice)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"--ids-file {args.ids_file} is not UTF-8 text (byte {err.start}): give a text file of "
                         "sample IDs") from None
    return [i for i in re.split(r"[\s,]+", text) if i]


def run_request(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.config import load_params
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import submit_request
    from fedunlearn.requests.model import MAX_REASON_LENGTH, SUBJECT_FIELDS, RequestKind, build_request
    from fedunlearn.user_files import plain_note

    config = load_params(root / "params.yaml").scenario(args.scenario)
    kind = RequestKind(args.request_kind)
    if kind is RequestKind.CLIENT:
        require_client(config, args.scenario, args.client)
    field = SUBJECT_FIELDS[kind]  # --client and --label are stored under the subject's own field name
    subject = own_ids(root, args.scenario, read_sample_ids(args)) if kind is RequestKind.SAMPLE else getattr(args, field)
    reason = None if args.reason is None else plain_note(args.reason, "--reason", MAX_REASON_LENGTH)
    request = build_request({"kind": kind, "scenario": args.scenario, "reason": reason, field: subject,
                             "deadline": args.deadline})
    if kind is RequestKind.SAMPLE:
        require_known_ids(root, args.scenario, request.sample_ids)
    path = submit_request(RequestFolders.create(root), request)
    print(request.request_id)
    print(f"wrote {path.relative_to(root)}; forget it with `fedunlearn process --scenario {args.scenario}` (or only "
          f"delete the data: `fedunlearn ingest --scenario {args.scenario}`)", file=sys.stderr)
    return 0


def require_client(config, scenario: str, client: int) -> None:
    """A client request names a client of the scenario's partition; checked before anything is written
    (the batch would only quarantine it later, or find the client "already deleted")."""
    from fedunlearn.errors import InputError

    if config.setting == "vfl":
        raise InputError(f"{scenario} is vertical (VFL): its parties share every sample ID, so a client request names "
                         "no samples; request the sample IDs instead (`fedunlearn request samples`); nothing was written")
    count = config.partition.num_clients
    if not 0 <= client < count:
        raise InputError(f"--client {client}: {scenario} has clients 0 to {count - 1} (partition.num_clients: "
                         f"{count}); give one of them; nothing was written")


def own_ids(root: Path, scenario: str, ids: list[str]) -> list[str]:
    """The IDs as the data holds them: a user source's IDs are its own (the ID column, the image's
    path); the form ``<dataset>-<ID>`` that earlier versions stored is accepted too, and written as
    the source's own ID."""
    from fedunlearn.data.store import PARTITIONS_DIR
    from fedunlearn.requests.catalog import load_catalog

    if not (root / PARTITIONS_DIR / scenario / "manifest.json").is_file():
        return ids
    catalog = load_catalog(scenario, root, set())
    prefix = f"{catalog.dataset}-"
    return [i[len(prefix):] if i not in catalog.labels and i.startswith(prefix) and i[len(prefix):] in catalog.labels
            else i for i in ids]


def require_known_ids(root: Path, scenario: str, ids: list[str]) -> None:
    """Sample IDs not in the scenario's current data version are refused now (exit 2, nothing
    submitted), not quarantined by the next batch: those the ledger deleted already are named as such,
    the others as never in the data. Before `fedunlearn prepare` there is nothing to check against:
    the batch checks them then."""
    from fedunlearn.data.store import PARTITIONS_DIR
    from fedunlearn.errors import InputError
    from fedunlearn.requests.catalog import load_catalog
    from fedunlearn.requests.ledger import LEDGER_PATH, LedgerDamaged, read_deleted_ids

    if not (root / PARTITIONS_DIR / scenario / "manifest.json").is_file():
        return
    known = load_catalog(scenario, root, set()).labels
    unknown = [i for i in ids if i not in known]
    if not unknown:
        return
    try:
        deleted = read_deleted_ids(root / LEDGER_PATH) if (root / LEDGER_PATH).is_file() else set()
    except LedgerDamaged:  # which were deleted cannot be told: `ledger verify` is the batch's to ask for
        deleted = set()
    gone, never = [i for i in unknown if i in deleted], [i for i in unknown if i not in deleted]
    parts = ([f"deleted already: {shown_ids(gone)} (`fedunlearn status --scenario {scenario}` shows their batch)"]
             if gone else []) + ([f"never in the data: {shown_ids(never)}"] if never else [])
    raise InputError(f"{len(unknown)} of {len(ids)} sample ID(s) are not in {scenario}'s current data version — "
                     f"{'; '.join(parts)}; nothing was submitted — list the valid ones with `fedunlearn ids "
                     f"--scenario {scenario}`")


def shown_ids(ids: list[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def run_ingest(args: argparse.Namespace, root: Path) -> int:
    from cli.common import erasure_status, prepare_flow_run, print_summary, require_data_for_requests, require_scenario

    require_scenario(root, args.scenario)  # before the imports: Prefect and torch take seconds
    from flows.ingest import ingest_deletions
    from stores.workspace import init_workspace

    init_workspace(root)
    require_data_for_requests(root, args.scenario, "ingest")
    prepare_flow_run(args.verbose)
    result = ingest_deletions(scenario=args.scenario, root=str(root), purge=args.purge)
    print_summary(result)
    return erasure_status(result.erasure)



def run_status(args: argparse.Namespace, root: Path) -> int:
    from cli.text import plain
    from fedunlearn.errors import ErasureNotVerified, RequestOverdue, StateDamaged
    from runtime.local_server import served_prefect_api
    from tasks.status import deletion_status
    from stores.workspace import Workspace

    ws = Workspace.open(root)
    ws.params.scenario(args.scenario)
    with served_prefect_api():  # the next exact retrain is read from the served server, if one runs
        status = deletion_status(ws, args.scenario)
    print(plain(status.markdown()))
    warning = status.repayment_warning()
    if warning:  # a warning, not an exit status: status exits non-zero only once a deadline is missed (9)
        print(f"warning: {warning}", file=sys.stderr)
    if status.health:  # the health check: damage or a version that must not serve, each printed with its fix
        return StateDamaged.exit_code
    if status.overdue:
        return RequestOverdue.exit_code
    return ErasureNotVerified.exit_code if status.erasure_pending else 0  # the user's rows to delete: listed above


def run_rescan(args: argparse.Namespace, root: Path) -> int:
    from cli.common import prepare_flow_run, require_scenario

    require_scenario(root, args.scenario)  # before the imports: Prefect and torch take seconds
    from fedunlearn.errors import ErasureNotVerified
    from flows.rescan import rescan_source

    prepare_flow_run(args.verbose)
    result = rescan_source(scenario=args.scenario, root=str(root))
    for batch_id in result.cleared:
        print(f"{batch_id}: the deleted rows are gone from the source; its receipt says so")
    for batch_id, line in result.still.items():
        print(f"{batch_id}: {line}")
    if not result.cleared and not result.still:
        print(f"no erasure is pending at the source of {args.scenario}'s dataset")
    return ErasureNotVerified.exit_code if result.still else 0

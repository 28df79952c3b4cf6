"""``fedunlearn process`` (the deletion batch), ``fedunlearn retrain`` (the reference),
``fedunlearn repay-debt`` (the exact retrain that repays approximate forgetting), ``fedunlearn
compare`` (the registry side by side), ``fedunlearn hold`` (a version's weights kept on purpose) and
``fedunlearn serve`` (the deployments)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cli.common import (DEFAULT_SCENARIO, describe_batch, erasure_status, prepare_flow_run, print_summary,
                        require_data_for_requests, require_methods, require_scenario)
from fedunlearn.device import DEVICE_CHOICES

HOLD_LOCK_TIMEOUT_S = 60.0  # a hold waits for a running batch, whose retirement step it must not race
MAX_HOLD_REASON = 500  # characters: it is repeated in tags, the log, status and every receipt it concerns


def register(sub: argparse._SubParsersAction) -> None:
    process = sub.add_parser(
        "process", help="forget the pending deletion requests: unlearn, certify, evaluate, register, receipt",
        description="The process-deletions flow: validate the pending requests of the scenario (invalid ones go to "
                    "quarantine/), apply them as one batch (ledger, new data version, erasure check), unlearn them "
                    "from the current model, certify and evaluate the result, register it as a new version, move "
                    "the alias 'current' to it if it passes the gates, and write data/receipts/<batch_id>.json. "
                    "With nothing pending it changes nothing; after a failure, running it again resumes the batch.")
    add_process_arguments(process)
    process.set_defaults(handler=run_process)

    retrain = sub.add_parser("retrain", help="retrain the reference model on the current data version",
                             description="The retrain-reference flow: train from scratch on the current data version "
                                         "and register the version with alias 'retrained' (kept if it exists).")
    retrain.add_argument("--scenario", default=DEFAULT_SCENARIO, help="the scenario to retrain (default %(default)s)")
    retrain.add_argument("--device", choices=DEVICE_CHOICES, help="override params.yaml's device")
    retrain.set_defaults(handler=run_retrain)

    repay = sub.add_parser("repay-debt", help="exact retrain now if any request was forgotten only approximately",
                           description="The repay-retrain-debt flow (also deployed weekly by make serve): when a "
                                       "batch since the last exact retrain was forgotten with a certificate other "
                                       "than 'exact retrain' or 'formal (ε,δ)', retrain on the current data "
                                       "version, serve it (alias current) and mark those receipts exactly forgotten.")
    repay.add_argument("--scenario", default=DEFAULT_SCENARIO,
                       help="the scenario whose retrain debt to repay (default %(default)s)")
    repay.add_argument("--device", choices=DEVICE_CHOICES, help="override params.yaml's device")
    repay.add_argument("--only-due", action="store_true",
                       help="a federation in shards: retrain only the shards owed by a request whose latest safe start "
                            "has come (the others keep serving until theirs, or a run without this flag)")
    repay.set_defaults(handler=run_repay_debt)

    compare = sub.add_parser("compare", help="the registered versions of a scenario side by side",
                             description="Print every registered version of the scenario's model — aliases, role, "
                                         "method, data version, test/forget accuracy, MIA AUC, audit AUC, certificate, "
                                         "cost — and log the table as an MLflow artifact (experiment "
                                         "<scenario>-comparisons). The forget-set columns are on one deletion batch's "
                                         "forget set, named above the table: its source, unlearned and retrained "
                                         "versions side by side.")
    compare.add_argument("--scenario", default=DEFAULT_SCENARIO,
                         help="the scenario whose registered versions to compare (default %(default)s)")
    compare.add_argument("--batch", metavar="BATCH_ID",
                         help="the batch whose forget set the forget-set columns are on (default: the newest batch "
                              "with a receipt)")
    compare.set_defaults(handler=run_compare)

    register_hold(sub)

    serve = sub.add_parser("serve", help="serve the Prefect deployments (needs PREFECT_API_URL; see make serve)",
                           description="Register the deployments — process-deletions on a cron schedule, "
                                       "retrain-reference, train-federated and benchmark on demand — with the Prefect "
                                       "server in PREFECT_API_URL and run their flow runs until Ctrl-C.")
    serve.add_argument("--scenario", default=DEFAULT_SCENARIO, help="default scenario of the deployments' forms")
    serve.add_argument("--cron", help="schedule of the deletion batches (default: daily at 02:00 UTC)")
    serve.add_argument("--gpu-slots", type=int, default=1, metavar="N",
                       help="concurrency limit of tasks tagged gpu (default 1: one GPU worker)")
    serve.add_argument("--cold-runs", action="store_true",
                       help="accepted for older scripts; every flow run is Prefect's own process already")
    # Its console is the served flow runs' log (make serve writes it to serve.log), its links point at a
    # server that keeps running: the libraries' logs stay on.
    serve.set_defaults(handler=run_serve, verbose=True)


def register_hold(sub: argparse._SubParsersAction) -> None:
    hold = sub.add_parser("hold", help="keep a registered version's weights on purpose (a litigation hold, an audit)",
                          description="A version that learnt deleted samples loses its weights once every request it "
                                      "learnt is exactly forgotten (its record stays: `fedunlearn compare`). A hold "
                                      "keeps them: tagged on the version, logged in the transparency log, listed by "
                                      "`fedunlearn status` with the requests the version still holds, and said on "
                                      "those requests' receipts.")
    hold.add_argument("version", metavar="VERSION", help="the registered version, e.g. 1 or v1")
    hold.add_argument("--reason", required=True, help=f"why it is kept: one line of plain text, at most {MAX_HOLD_REASON} "
                      "characters (said in status, receipts and the log)")
    hold.add_argument("--scenario", default=DEFAULT_SCENARIO,
                      help="the scenario whose registered model VERSION is (default %(default)s)")
    hold.set_defaults(handler=run_hold)


def add_process_arguments(process: argparse.ArgumentParser) -> None:
    process.add_argument("--scenario", default=DEFAULT_SCENARIO,
                         help="the scenario whose pending deletion requests to forget (default %(default)s)")
    process.add_argument("--method", default="auto",
                         help="unlearning method (default auto: puf-special for HFL, fedora for VFL class "
                              "requests and ga for VFL sample requests, certified-dfu for DFL)")
    process.add_argument("--method-options", type=json.loads, default={}, metavar="JSON",
                         help='the method\'s hyperparameters, e.g. \'{"max_recovery_rounds": 5}\'')
    process.add_argument("--retrain", action="store_true",
                         help="also retrain the reference on the new data version (the gates then compare with it)")
    process.add_argument("--device", choices=DEVICE_CHOICES, help="override params.yaml's device")
    process.add_argument("--forgetting-policy", choices=["interim", "strict"],
                         help="override params.yaml's forgetting_policy: interim (an approximate version that fails no "
                              "check serves now, an exact retrain is scheduled before the deadlines) or strict "
                              "(escalate until a version passes every check, an exact retrain at worst)")
    process.add_argument("--runner", choices=["in-process", "flower", "flower-simulation"],
                         help="the engine that unlearns (default: the scenario's runner in params.yaml, else "
                              "in-process): flower = a local Flower deployment, flower-simulation = Flower's "
                              "simulation engine (HFL; the exact retrain stays in-process)")


def run_process(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)  # before the imports: Prefect and torch take seconds
    require_methods(root, args.scenario, method=args.method)
    if args.runner is None:  # a runner named is checked by the flow, pending requests or not
        from fedunlearn.requests.idle import NO_PENDING, nothing_to_process

        if nothing_to_process(root, args.scenario):  # what the flow would print, without its seconds
            print(NO_PENDING)
            return 0
    from flows.process import process_deletions
    from stores.workspace import init_workspace

    init_workspace(root)
    require_data_for_requests(root, args.scenario, "process")
    prepare_flow_run(args.verbose)
    result = process_deletions(scenario=args.scenario, root=str(root), method=args.method,
                               retrain_reference=args.retrain, method_options=args.method_options,
                               device=args.device, forgetting_policy=args.forgetting_policy, runner=args.runner)
    print_summary(result)
    for line in result.warnings:  # logged by the flow too; repeated here beside the batch's outcome
        print(f"warning: {line}")
    if result.receipt is None:
        if result.exact_run:  # nothing pending, but the retrain debt could not wait
            print(f"exact retrain {result.exact_run}")
        print_siblings(result)
        return 0
    print(describe_batch(result))
    print_siblings(result)
    return erasure_status(result.erasure)


def print_siblings(result) -> None:
    """Other scenarios of the dataset whose models still serve the deleted samples, and what forgets them."""
    for line in result.siblings_owed:
        print(f"owed: {line}")


def run_retrain(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)  # before the imports: Prefect and torch take seconds
    from flows.reference import retrain_reference
    from stores.workspace import init_workspace

    init_workspace(root)
    prepare_flow_run(args.verbose)
    result = retrain_reference(scenario=args.scenario, root=str(root), device=args.device)
    print(f"{args.scenario} v{result.model_version} (alias 'retrained') on data version {result.data_version}"
          f"{' (already there)' if result.reused else ''}")
    if result.closed:  # batches applied by `ingest` alone: the retrain forgets their requests exactly
        print(f"alias current -> {args.scenario} v{result.model_version}: it closes the batch(es) applied without "
              f"unlearning {', '.join(result.closed)} (receipts written)")
    return 0


def run_repay_debt(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)  # before the imports: Prefect and torch take seconds
    from flows.debt import repay_retrain_debt
    from stores.workspace import init_workspace

    init_workspace(root)
    prepare_flow_run(args.verbose)
    result = repay_retrain_debt(scenario=args.scenario, root=str(root), device=args.device, only_due=args.only_due)
    if result.shards_waiting:
        print(f"shard(s) {', '.join(map(str, result.shards_retrained))} retrained exactly: {args.scenario} "
              f"v{result.version} (alias current); {len(result.repaid)} batch(es) forgotten exactly, shard(s) "
              f"{', '.join(map(str, result.shards_waiting))} still owe(s) (repaid by their own latest safe start "
              "or the weekly run)")
    elif not result.repaid:
        print(f"no retrain debt for {args.scenario}{' due yet' if args.only_due else ''}: nothing to retrain")
    else:
        print(f"repaid {len(result.repaid)} batch(es) with {args.scenario} v{result.version} (alias current)")
    if result.retired:
        print(f"retired {', '.join('v' + v for v in result.retired)}: their weights deleted (they learnt the requests "
              f"now forgotten exactly), their records kept (`fedunlearn compare --scenario {args.scenario}`)")
    return 0


def run_compare(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)
    from cli.text import plain
    from fedunlearn.errors import InputError
    from fedunlearn.receipts import read_receipt
    from fedunlearn.requests.folders import RECEIPTS_DIR
    from tasks.debt import retrain_debt
    from tasks.receipts import comparison
    from stores.workspace import Workspace

    ws = Workspace.open(root)
    if args.batch and read_receipt(ws.root, args.batch) is None:
        raise InputError(f"no receipt of {args.batch!r} in {RECEIPTS_DIR.as_posix()}/: "
                         f"`fedunlearn status --scenario {args.scenario}` lists the batches")
    print(plain(comparison(ws, args.scenario, args.batch)[1]))
    print(f"\n{retrain_debt(ws, args.scenario).line(ws.params.requests.max_retrain_debt)}")
    return 0


def run_hold(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)
    from fedunlearn.errors import InputError
    from fedunlearn.requests.model import utc_now
    from fedunlearn.user_files import plain_note
    from stores.workspace import Workspace
    from tasks.retirement import hold_version

    version = args.version.removeprefix("v")
    reason = plain_note(args.reason, "--reason", MAX_HOLD_REASON)
    if not version.isdigit() or not reason:
        raise InputError(f"`fedunlearn hold {args.version} --reason {args.reason!r}`: give a version number (e.g. 1) "
                         "and a non-empty reason")
    ws = Workspace.open(root)
    if version not in {str(v.version) for v in ws.registry.versions(args.scenario)}:
        raise InputError(f"{args.scenario} has no version {version}: `fedunlearn compare --scenario {args.scenario}` "
                         "lists them")
    with ws.batch_lock(HOLD_LOCK_TIMEOUT_S, f"fedunlearn hold {version} --scenario {args.scenario}"):
        held = hold_version(ws, args.scenario, version, reason, utc_now())
    print(f"{args.scenario} v{version} held ({reason}): its weights stay"
          + (f"; it still holds {len(held)} request(s): {', '.join(held[:5])}" if held else ""))
    return 0


def run_serve(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)  # the forms' default: one params.yaml defines
    from flows.serve import DEFAULT_CRON, serve_deployments

    if not os.environ.get("PREFECT_API_URL"):
        raise ValueError("set PREFECT_API_URL to a running Prefect server (e.g. http://127.0.0.1:4200/api): "
                         "`make serve` starts one with the deployments and both UIs")
    serve_deployments(root, args.scenario, args.cron or DEFAULT_CRON, args.gpu_slots)
    return 0

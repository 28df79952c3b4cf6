"""What the commands share: the default scenario, the setup before a command runs a flow, and how
a batch's outcome is printed."""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # the flows are imported when a command runs, not when the CLI starts
    from fedunlearn.requests.erasure import ErasureReport
    from flows.results import IngestResult, ProcessResult

DEFAULT_SCENARIO = "mnist5k-hfl"
# What prepare_flow_run started for the command (its Prefect server): closed as the command ends.
_COMMAND_SCOPE = contextlib.ExitStack()
atexit.register(_COMMAND_SCOPE.close)
# What the command does the moment its own Prefect server exits by itself (``leave_when_own_server_exits``).
_ON_OWN_SERVER_EXIT: list[Callable[[], None]] = []


# Where the libraries' own deprecations are raised from: nothing a user of the command can act on.
LIBRARY_MODULES = r"(dvc|dvc_[a-z_]+|great_expectations|mlflow|prefect|pygtrie|scmrepo)(\.|$)"


def silence_library_deprecations() -> None:
    """Quiet mode: the libraries' deprecation warnings off the console, ours kept. Called again once
    the flows are imported: Flower's simulation module shows every DeprecationWarning ("once") from
    its import on, ahead of any filter set before it."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=LIBRARY_MODULES)


def prepare_flow_run(verbose: bool = False) -> None:
    """Before a command runs a flow: per-task-run chatter would bury the per-round progress lines,
    and without PREFECT_API_URL the command's flows need a Prefect server of its own, one that dies
    with this process (``runtime.local_server``), until ``end_command``. With ``verbose`` the flow
    runs' "View at" links are on the console: say once that they point at that server."""
    from runtime.local_server import local_prefect_api

    for name in ("prefect.task_runs", *(() if verbose else ("great_expectations", "mlflow", "alembic"))):
        logging.getLogger(name).setLevel(logging.WARNING)
    if not verbose:
        silence_library_deprecations()
    quiet_known_tracebacks()
    own_server = _COMMAND_SCOPE.enter_context(local_prefect_api(on_exit=next(iter(_ON_OWN_SERVER_EXIT), None)))
    if verbose and own_server is not None:
        print(f"(this command's own Prefect server, {own_server}, stops when the command ends: its \"View at\" "
              "links last as long; `make serve` keeps one running)", file=sys.stderr)


def leave_when_own_server_exits(command: str, root: Path) -> None:
    """For the real command line (cli.main; a test calling main() in-process is not ended): once the
    command's own Prefect server exits by itself, end the command at once with ``lost_service``'s one
    ``error:`` line and its exit status. Every later call to the server would be retried for minutes,
    with a warning line each, and a batch resumes from any point it stops at."""
    def leave() -> None:
        from cli import leave_now

        lost = lost_service(ConnectionError("the server's process exited"), command, root)
        print(f"error: {lost}", file=sys.stderr)
        leave_now(lost.exit_code if lost is not None else 1)

    _ON_OWN_SERVER_EXIT[:] = [leave]


class KnownErrorTracebacks(logging.Filter):
    """A server that stops answering makes Prefect log the same connection error, with its traceback, at
    every layer (task run, flow run, the log and event workers); an error whose class says what was
    wrong and what to do (``FedunlearnError``: the batch lock held by another run, bad input) is logged
    by the flow run with its traceback too. The command ends with one ``error:`` line that says it
    (``lost_service``, ``report_error``), so these keep their line and lose the traceback, which would
    bury it. ``BatchFailed`` keeps its traceback: its cause may be a defect."""

    def filter(self, record: logging.LogRecord) -> bool:
        from fedunlearn.errors import BatchFailed, FedunlearnError, causes
        from runtime.local_server import connection_lost

        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        known = next((e for e in causes(error) if isinstance(e, FedunlearnError) and not isinstance(e, BatchFailed)),
                     None)
        cut = connection_lost(error) or known
        if cut is not None:
            record.msg, record.args = f"{record.getMessage()} ({type(cut).__name__}: {cut})", ()
            record.exc_info, record.exc_text = None, None
        return True


def quiet_known_tracebacks() -> None:
    """``KnownErrorTracebacks`` on every handler this process logs through (Prefect's console and its
    internal workers' handler included)."""
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for handler in {handler for logger in loggers for handler in logger.handlers}:
        if not any(isinstance(f, KnownErrorTracebacks) for f in handler.filters):
            handler.addFilter(KnownErrorTracebacks())


class ServiceLost(Exception):
    """A server the command depends on went away: exit status 1, as for ``BatchFailed`` (the command run
    again resumes); ``prefect_gone`` when it was the Prefect server, whose clients then hold logs and
    events that nothing can take any more."""

    exit_code = 1

    def __init__(self, message: str, prefect_gone: bool):
        super().__init__(message)
        self.prefect_gone = prefect_gone


def lost_service(err: BaseException, command: str, root: Path) -> ServiceLost | None:
    """The error to report when ``err`` came from a server the command depends on going away, naming
    it and the fix: the workspace's PostgreSQL stopped (`fedunlearn db start`, then the command again),
    the command's own Prefect server exited, or a Prefect server stopped answering (the command again).
    None for any other error, and — unless the database stopped, which explains any failure but bad
    input — for one whose class already says what it means and what to do."""
    from fedunlearn.errors import BatchFailed, FedunlearnError, InputError
    from runtime.local_server import LocalServerFailed, connection_lost, exited_early

    exited = exited_early()
    if isinstance(err, (InputError, LocalServerFailed)):
        return None
    cause = connection_lost(err) or err
    why = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else 'no message'}"
    if isinstance(err, BatchFailed):  # where it stopped: "batch <id> (<scenario>) failed at <step>"
        why = f"{str(err).split(': ')[0]}; {why}"
    again = (f"run {command} again: a deletion batch resumes where it stopped and nothing is applied twice")
    database = stopped_database(root)
    if database is not None:
        return ServiceLost(f"the workspace's PostgreSQL ({database}) stopped while the command ran ({why}). Start it "
                           f"with `fedunlearn --root {root} db start`, then {again}", prefect_gone=exited is not None)
    if isinstance(err, FedunlearnError) and not isinstance(err, BatchFailed):
        return None
    if exited is not None:
        status, log = exited
        return ServiceLost(f"the command's own Prefect server stopped while the command ran (exit status {status}; "
                           f"its log: {log}) ({why}). It starts anew with the command: {again}", prefect_gone=True)
    if connection_lost(err) is not None:
        from prefect.settings import PREFECT_API_URL

        server = PREFECT_API_URL.value() or "its address"
        return ServiceLost(f"lost the connection to the Prefect server at {server} ({why}). Make sure it runs "
                           f"(`make serve` starts one), then {again}", prefect_gone=True)
    return None


def stopped_database(root: Path) -> Path | None:
    """The workspace's own PostgreSQL cluster when the workspace is on it and it does not run now."""
    from stores import postgres

    try:
        config = postgres.workspace_config(root)
    except (OSError, ValueError):  # an unreadable marker is another error's business, not this message's
        return None
    if not isinstance(config, dict) or config.get("server") != "local":
        return None
    cluster = postgres.LocalCluster(Path(root) / postgres.PG_DIR)
    return cluster.directory if cluster.initialized and cluster.port() is None else None


def end_command() -> None:
    """Stop what ``prepare_flow_run`` started (cli.main calls it as each command ends)."""
    _COMMAND_SCOPE.close()


def require_scenario(root, scenario: str) -> None:
    """Before anything starts (a Prefect server, a flow run): ``scenario`` is one params.yaml defines,
    else one line naming those it does (exit 2)."""
    from fedunlearn.config import load_params
    from fedunlearn.errors import InputError

    try:
        load_params(root / "params.yaml").scenario(scenario)
    except ValueError as err:  # Params.scenario's message names the scenarios there are
        raise InputError(str(err)) from None


def require_data_for_requests(root, scenario: str, command: str) -> None:
    """Before a flow starts: requests of ``scenario`` waiting in the inbox are checked against its
    data, so a workspace initialised but never prepared is told to run `fedunlearn prepare` (exit 2)
    instead of failing inside the flow. With none waiting the command needs no data."""
    from fedunlearn.data.store import PARTITIONS_DIR, require_prepared
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import scan_inbox

    folders = RequestFolders(root)
    if (root / PARTITIONS_DIR / scenario / "manifest.json").is_file() or not folders.inbox.is_dir():
        return
    # Unreadable files are quarantined and other scenarios' requests left waiting: neither needs the data.
    if any(item.request is not None and item.request.scenario == scenario for item in scan_inbox(folders, scenario)):
        require_prepared(scenario, root, f"`fedunlearn --root {root} {command} --scenario {scenario}`")


def erasure_line(report: ErasureReport) -> str:
    unverifiable = len(report.not_verifiable)
    caveat = f"; {unverifiable} not verifiable (see the record)" if unverifiable else ""
    if report.found:
        held = "; ".join(f"store {s.name}: {', '.join(s.found)}" for s in report.stores if s.found)
        return f"erasure NOT verified: the bytes of {len(report.found)} deleted sample(s) are still in {held}"
    if not report.verified and not report.source_pending:
        return f"erasure not verifiable: none of the {report.deleted_samples} deleted samples can be recognised"
    if report.source_pending:
        return f"{report.source.line()}; no other store in scope holds a deleted row"
    skipped = "; ".join(f"{s.name} ({s.note})" for s in report.stores if not s.in_scope)
    source = f"; {report.source.line()}" if report.source is not None else ""
    return (f"erasure verified: no bytes of the {report.checked_samples} checked samples in "
            f"{report.files_scanned} files of the stores {', '.join(s.name for s in report.stores if s.in_scope)}"
            f"{caveat}{'; not scanned: ' + skipped if skipped else ''}{source}")


def erasure_status(report: ErasureReport | None) -> int:
    """The exit status after a batch: ``ErasureNotVerified``'s when a store still holds a deleted row."""
    from fedunlearn.errors import ErasureNotVerified

    return ErasureNotVerified.exit_code if report is not None and report.found else 0


def print_summary(result: IngestResult) -> None:
    for batch_id in result.resumed:
        print(f"finished {batch_id}, which had been interrupted")
    for name in result.already_applied:
        print(f"already applied, moved to processed/: {name}")
    for note in result.quarantined:
        print(f"quarantined {note.file!r}: {note.reason}\n  -> {note.moved_to} (reason in "
              f"{note.moved_to}.reason.txt)")
    if result.left_pending:
        print(f"left in the inbox (other scenarios): {', '.join(result.left_pending)}")
    for name, why in result.waiting.items():
        print(f"left in the inbox, still being written? {name!r}: {why}")
    if result.batch_id is None:
        if getattr(result, "forgotten_by", None):
            print(f"the pending requests were taken by batch {result.forgotten_by} while this run waited for it")
        print(result.status)
        return
    per_client = ", ".join(f"client {c}: {n}" for c, n in result.per_client.items())
    print(f"{result.batch_id}: {len(result.applied)} request(s) applied, {result.deleted_ids} sample "
          f"IDs deleted{f' ({per_client})' if per_client else ''}")
    print(f"data version {result.data_version_before} -> {result.data_version_after}")
    print(erasure_line(result.erasure))
    print(f"record: {result.record}")


def describe_batch(result: ProcessResult) -> str:
    """What a processed batch did to the registry: the attempts; where alias current went, with the
    reason on the same line (the receipt's serve line: tier, checks, what is owed by when); the
    receipt; where the flow's time went."""
    from cli.text import plain

    receipt = result.receipt_written
    retrained = result.reference
    interim_tier = receipt.policy != "strict"
    chain = " -> ".join(f"{a.method} ({a.reading(interim_tier)})" for a in result.attempts)
    what = f" ({result.method}, {result.certificate}" + (f"; retrained reference v{retrained.version}" if retrained
                                                         else "") + ")" if result.method else ""
    timings = result.timings
    exact = f"exact retrain: {result.exact_run}\n" if result.forgetting == "interim" and result.exact_run else ""
    return (f"attempts: {chain}\n"
            f"{plain(receipt.promotion(arrow='->'))}{what}: {plain(receipt.serve_reason())}\n"
            f"{exact}"
            f"receipt: {result.receipt}\n"
            f"{result.retrain_debt}\n"
            f"flow {timings.flow_seconds:.1f} s: compute {timings.core_seconds:.1f} s (data, unlearning, "
            f"evaluation), orchestration {timings.orchestration_seconds:.1f} s "
            f"({timings.orchestration_share:.0%}: Prefect, MLflow, DVC, validation, ledger, receipt)")


def require_methods(root, scenario: str, method: str | None = None, methods: str | None = None) -> None:
    """Before anything starts: ``--method`` (``auto`` or one method) or ``--methods`` (``all`` or a
    list) names methods that unlearn in the scenario's setting, else one line naming those that do
    (exit 2). Call after ``require_scenario``."""
    from fedunlearn.config import load_params
    from fedunlearn.method_choice import require_method, require_methods as require_listing

    setting = load_params(root / "params.yaml").scenario(scenario).setting
    if method is not None:
        require_method(method, setting, scenario)
    if methods is not None:
        require_listing(methods, setting, scenario)

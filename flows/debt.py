"""Flow ``repay-retrain-debt``: the exact retrain that repays approximate forgetting.

    retrain debt (receipts forgotten only approximately) ─▶ none: nothing to do
    ─▶ retrain-reference on the current data version ─▶ alias current ─▶ the receipts it covers
    record when their requests were forgotten exactly ─▶ the retrain measured on each of their
    batches' forget sets (beside each batch's source and unlearned version) ─▶ the versions that
    learnt them retire (``tasks.retirement``) ─▶ the status and the receipts published as Prefect
    artifacts, so that a monitor watching ``deletion-status-<scenario>`` sees the repayment

Deployed weekly by ``make serve`` (``repay-retrain-debt/weekly``); each interim batch schedules a
run of it at the latest safe time before its requests' deadlines (``tasks.debt.schedule_repayment``);
``process-deletions`` runs it when the debt passes ``requests.max_retrain_debt`` (params.yaml) or
that time has come.
"""

from __future__ import annotations

import torch
from prefect import flow

from flows.forget_sets import measure_retrained, retrain_device
from flows.heartbeat import parent_heartbeat
from flows.reference import retrain_reference
from flows.results import RepayResult
from tasks.data import command_device
from fedunlearn.receipts import read_receipt
from tasks.debt import close_by_retrain, mark_repaid, open_batches, retrain_debt
from tasks.receipts import publish_receipt
from tasks.retirement import retire_forgotten
from tasks.status import publish_status
from stores.workspace import ScenarioScope, Workspace


# An exact retrain takes minutes; a batch running meanwhile is waited for, as batches wait for each other.
LOCK_TIMEOUT_S = 1800.0


@flow(name="repay-retrain-debt", log_prints=True)
def repay_retrain_debt(scenario: str = "mnist5k-hfl", root: str = ".", device: str | None = None) -> RepayResult:
    """Retrain ``scenario`` exactly on its current data version and serve it, if any request was
    forgotten only approximately since the last exact retrain. Holds the batch lock: no deletion
    batch moves the data or ``current`` meanwhile.

    Args:
        scenario: a scenario of the workspace's params.yaml.
        root: the workspace (the directory holding params.yaml).
        device: auto, cpu, cuda or mps; empty: params.yaml's ``device``.
    """
    ws = Workspace.open(root)
    scope = ScenarioScope(ws, scenario)
    with ws.batch_lock(LOCK_TIMEOUT_S, f"fedunlearn repay-debt --scenario {scenario}"), parent_heartbeat():
        return repay(scope, command_device(ws, device))


def repay(scope: ScenarioScope, device: torch.device) -> RepayResult:
    """The repayment itself, for a caller that holds the batch lock (``process-deletions``), on the
    device the command chose. Batches applied without unlearning are closed by the same retrain
    (``close_by_retrain``)."""
    ws, scenario = scope.ws, scope.scenario
    debt = retrain_debt(ws, scenario)
    if not debt.receipts and not open_batches(ws, scenario):
        print("no retrain debt")
        retire_forgotten(ws, scenario)  # a retirement a killed run left unfinished is completed
        return RepayResult(scenario=scenario, repaid=[])
    reference = retrain_reference(scenario=scenario, root=str(ws.root), device=str(device), close_open=False)
    closed = close_by_retrain(ws, scenario, ws.registry.alias_ref(scenario, "retrained"), "repay-retrain-debt")
    repaid = closed + mark_repaid(ws, scenario, reference.model_version, "repay-retrain-debt")
    measure_retrained(ws, scenario, reference.model_version, repaid, retrain_device(reference) or device)
    retired = retire_forgotten(ws, scenario)
    publish_repayment(scope, repaid)
    print(f"{debt.line(ws.params.requests.max_retrain_debt)}: repaid by {scenario} v{reference.model_version} "
          f"(alias current)")
    return RepayResult(scenario=scenario, repaid=repaid, version=reference.model_version,
                       retired=list(retired.versions))


def publish_repayment(scope: ScenarioScope, repaid: list[str]) -> None:
    """The status artifact and each repaid batch's receipt artifact, as a batch publishes its own."""
    publish_status(scope)
    for batch_id in repaid:
        receipt = read_receipt(scope.ws.root, batch_id)
        if receipt is not None:
            publish_receipt(receipt)

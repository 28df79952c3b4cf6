"""The ``process-deletions`` flow on digits-hfl through a temporary Prefect server (one for the
module), a real DVC repository and a real sqlite MLflow registry, driven by the CLI: a clean
no-op; a batch that fails after its ledger append and is resumed from the DVC cache (arranged once
for the module: ``resumed``); its attempts gated against a retrained reference and escalated until
one passes (every attempt registered, the receipt listing the chain, ``current`` on a version of
the new data version); a re-run that changes nothing; retrain debt listed and repaid (arranged once
for the module: ``repaid``). Then the typed batch built from the ledger, and the escalation policy,
without a server.

Each test reads as arrange, act, assert. A test of a module fixture's outcome only asserts: the
fixture arranged and acted once for the module, and returned a frozen record of what its runs left."""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

import flows.process as process_flow
import flows.unlearn as unlearn_stage
from fedunlearn.data.store import load_horizontal
from fedunlearn.evaluation.records import VERSION_METRICS
from fedunlearn.federation.local import Tensors
from fedunlearn.receipts import Receipt, read_receipt, read_receipts, write_receipt
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger, LedgerEntry
from fedunlearn.unlearning.escalation import Attempt, checked_escalation, default_escalation, stronger
from stores.registry import Registry, tracking_uri
from stores.workspace import data_version
from workspaces import Printed, call_cli, cli_training, copy_workspace

SCENARIO = "digits-hfl"


def registry(workspace) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))


def versions_by_role(workspace) -> dict[str, list]:
    found: dict[str, list] = {}
    for version in registry(workspace).search_model_versions(f"name='{SCENARIO}'"):
        found.setdefault(version.tags["role"], []).append(version)
    return found


def crash(*args, **kwargs):
    raise RuntimeError("simulated crash")


def cli_ok(workspace, *args: str) -> Printed:
    """A CLI call that must succeed (it arranges a test's state)."""
    printed = call_cli(workspace, *args)
    assert printed.status == 0, printed.err
    return printed


@dataclass(frozen=True)
class Resumed:
    """The module's batch: what the crashed run printed and left, and what the resuming run printed."""

    workspace: Path
    ids: list[str]             # the 12 sample IDs of client 1 requested
    request_id: str
    before: str                # the data version before the batch
    crashed: Printed           # `process --retrain` with unlearning failing
    ledger_after_crash: list[str]
    after: str                 # the data version right after the crash
    roles_after_crash: list[str]
    remaining_after_crash: set[str]
    resumed: Printed           # the next `process --retrain`
    stages: list[str]          # the stages the resuming run called, in order

    @property
    def receipt(self) -> Receipt:
        [receipt] = read_receipts(self.workspace, SCENARIO)
        return receipt


@pytest.fixture(scope="module")
def resumed(trained_workspaces, prefect_server, tmp_path_factory) -> Resumed:
    """digits-hfl trained (a copy of the session's), 12 IDs of client 1 requested; `process
    --retrain` fails in unlearning (after its ledger append); the next `process --retrain` resumes
    the batch, reading the forget samples back from the DVC cache. Tests read it; a test that acts
    on it takes a copy."""
    # arrange
    template, _ = trained_workspaces.get(SCENARIO, cli_training(SCENARIO))
    workspace = copy_workspace(template, tmp_path_factory.mktemp("process") / "workspace")

    before = data_version(workspace, SCENARIO)
    ids = cli_ok(workspace, "ids", "--scenario", SCENARIO, "--client", "1", "--limit", "12").out.split()
    request_id = cli_ok(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids).out.strip()

    # act: the failing run, what it left, then the resuming run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unlearn_stage, "unlearn_in_gpu_slot", crash)
        crashed = call_cli(workspace, "process", "--scenario", SCENARIO, "--retrain")
    left = dict(ledger_after_crash=[e.request_id for e in Ledger(workspace / LEDGER_PATH).entries()],
                after=data_version(workspace, SCENARIO), roles_after_crash=sorted(versions_by_role(workspace)),
                remaining_after_crash=set(np.concatenate([c.sample_ids
                                                          for c in load_horizontal(SCENARIO, workspace).clients])))
    stages: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in STAGES:
            patch.setattr(process_flow, name, recording(getattr(process_flow, name), name, stages))
        printed = cli_ok(workspace, "process", "--scenario", SCENARIO, "--retrain")
    return Resumed(workspace, ids, request_id, before, crashed, resumed=printed, stages=stages, **left)


# The stages of process-deletions as its module docstring draws them, the end steps (debt, status) last.
STAGES = ["intake_requests", "apply_deletions", "unlearn_and_register", "promote_and_receipt", "finish_batch"]


def recording(stage, name: str, called: list[str]):
    def record(*args, **kwargs):
        called.append(name)
        return stage(*args, **kwargs)
    return record


def test_with_nothing_pending_a_run_changes_nothing(workspace, prefect_server):
    # act
    printed = call_cli(workspace, "process", "--scenario", SCENARIO)

    # assert
    assert printed.status == 0, printed.err
    assert printed.out.strip().endswith("no pending requests")
    assert not (workspace / "data/receipts").exists() and not (workspace / "mlflow/mlflow.db").exists()
    assert not (workspace / "dvc.lock").exists()


def test_a_batch_failing_after_its_ledger_append_keeps_the_deletion_and_says_how_to_resume(resumed):
    # assert
    assert resumed.crashed.status == 1
    assert "error: batch-" in resumed.crashed.err and "batch batch-" not in resumed.crashed.err
    assert "(digits-hfl) failed at unlearn and register:" in resumed.crashed.err
    assert "simulated crash; re-run `fedunlearn process --scenario digits-hfl` to resume" in resumed.crashed.err
    # The deletion itself happened: the ledger holds it and the data moved on without the samples.
    assert resumed.ledger_after_crash == [resumed.request_id]
    assert resumed.after != resumed.before and resumed.roles_after_crash == ["original", "retrained"]
    assert not set(resumed.ids) & resumed.remaining_after_crash


def test_the_resumed_batch_escalates_until_an_attempt_passes_registering_each_once(resumed):
    # assert
    receipt, workspace = resumed.receipt, resumed.workspace
    roles = versions_by_role(workspace)
    original, [retrained] = roles["original"][0], roles["retrained"]
    attempts = receipt.attempts
    *approximate, exact = attempts
    assert receipt.batch_id == retrained.tags["batch_id"]
    assert receipt.request_ids == [resumed.request_id] and receipt.forgotten_per_client == {"1": 12}
    assert (receipt.data_version_before, receipt.data_version_after) == (resumed.before, resumed.after)
    # Every attempt is registered once, in the policy's order, and every one but the last did not pass its gates.
    assert [a.attempt for a in attempts] == [0, 1, 2, 3, 4, 5]
    # The default escalation of a sample batch from PUF-Special (pinned below) tried to its end: every
    # approximate attempt is held back by its gates against the retrained reference; the exact retrain serves.
    assert [a.method for a in attempts] == ["puf-special", "puf-special", "puf-regular", "fedquit", "fedquit",
                                            "retrain"]
    assert all(a.gates.policy == "vs retrained reference" for a in approximate) and exact.gates is None
    assert all(not a.passed for a in approximate) and exact.passed
    unlearned = {int(v.tags["attempt"]): v for v in roles["unlearned"]}
    assert {n: str(v.version) for n, v in unlearned.items()} == {a.attempt: a.version.version for a in approximate}
    assert exact.version.version == str(retrained.version)  # the exact retrain is the batch's reference
    assert all(v.tags["batch_id"] == receipt.batch_id and v.tags["data_version"] == resumed.after and
               v.tags["source_version"] == str(original.version) for v in unlearned.values())


def test_current_is_the_passing_attempt_a_version_of_the_new_data_version(resumed, tmp_path):
    # assert
    receipt, workspace = resumed.receipt, resumed.workspace
    attempts, batch_id = receipt.attempts, receipt.batch_id
    current = registry(workspace).get_model_version_by_alias(SCENARIO, "current")
    assert current.tags["data_version"] == resumed.after and str(current.version) == attempts[-1].version.version
    assert receipt.promoted and receipt.models["current"].version == str(current.version)
    out = resumed.resumed.out
    assert f"receipt: data/receipts/{batch_id}.json" in out and f"alias current -> v{current.version}" in out
    artifacts = [a.path for a in registry(workspace).list_artifacts(current.run_id, "receipt")]
    assert artifacts == [f"receipt/{batch_id}.json"]
    unlearned = {int(v.tags["attempt"]): v for v in versions_by_role(workspace)["unlearned"]}
    certificate = registry(workspace).download_artifacts(unlearned[0].run_id, "certificate.json", str(tmp_path))
    assert json.loads(Path(certificate).read_text())["guarantee"] == "empirical only"


def test_the_batch_runs_its_stages_in_the_order_of_the_flow_diagram(resumed):
    # assert
    assert resumed.stages == STAGES


def test_every_version_logs_the_same_metrics_and_the_reference_the_forget_accuracy(resumed):
    # assert
    roles = versions_by_role(resumed.workspace)
    original, [retrained], unlearned = roles["original"][0], roles["retrained"], roles["unlearned"]
    assert len(unlearned) == 5  # one per approximate attempt
    for version in [original, retrained, *unlearned]:
        assert set(VERSION_METRICS) <= set(registry(resumed.workspace).get_run(version.run_id).data.metrics)
    # The batch's source is measured on the batch's forget set too (issue 37): its own figure, logged on its run.
    source_forget = registry(resumed.workspace).get_run(original.run_id).data.metrics["forget_acc"]
    assert source_forget == resumed.receipt.metrics["source"]["forget_acc"] and not math.isnan(source_forget)
    assert not math.isnan(registry(resumed.workspace).get_run(retrained.run_id).data.metrics["forget_acc"])


def test_each_version_names_its_data_version_and_the_batch_that_put_it_there(resumed):
    """Lineage in MLflow: each version's run has its data version as a dataset input (digest = the
    DVC hash, source = the partition), and its description says which batch put it there and why."""
    # assert
    receipt, workspace, before, after = resumed.receipt, resumed.workspace, resumed.before, resumed.after
    roles = versions_by_role(workspace)
    original, [retrained], unlearned = roles["original"][0], roles["retrained"], roles["unlearned"]
    lineage = Registry(workspace)
    partition = f"data/partitions/{SCENARIO}"
    assert lineage.data_inputs(original.run_id) == [(before, partition, "training")]
    assert lineage.data_inputs(retrained.run_id) == [(after, partition, "retraining")]
    assert all(lineage.data_inputs(v.run_id) == [(after, partition, "unlearning")] for v in unlearned)
    assert "**Original**" in lineage.version(SCENARIO, original.version).description and before in \
        lineage.version(SCENARIO, original.version).description
    for attempt in receipt.attempts:
        description = lineage.version(SCENARIO, attempt.version.version).description
        for text in (receipt.batch_id, resumed.request_id, f"`{attempt.method}`", attempt.certificate,
                     "deleted samples: 12", f"`{before}` → `{after}`", f"(escalation step {attempt.attempt + 1} of "):
            assert text in description, f"{text!r} not in the description of v{attempt.version.version}"
        assert not any(i in description for i in resumed.ids)  # counts only, never a sample ID
    *approximate, exact = receipt.attempts
    for attempt in approximate:  # gated: the verdict and every check named
        description = lineage.version(SCENARIO, attempt.version.version).description
        assert f"gates: **{attempt.gates.verdict}**" in description
        assert all(c.name in description for c in attempt.gates.checks)
    assert "gates: none needed" in lineage.version(SCENARIO, exact.version.version).description
    assert receipt.batch_id in lineage.version(SCENARIO, retrained.version).description
    [audit_set] = lineage.versions(f"{SCENARIO}-audit")  # trained by the batch on the new data's held-out split
    assert lineage.data_inputs(audit_set.run_id) == [(after, partition, "audit-reference")]


def test_the_shadow_model_trained_by_the_failed_run_is_read_back_by_the_resumed_one(resumed):
    # assert
    assert len(list((resumed.workspace / ".cache/shadow-models").glob(f"{SCENARIO}-*.pt"))) == 1


def test_a_rerun_after_the_batch_changes_nothing(resumed, tmp_path):
    # arrange
    workspace = copy_workspace(resumed.workspace, tmp_path / "workspace")
    ledger, lock = (workspace / LEDGER_PATH).read_bytes(), (workspace / "dvc.lock").read_bytes()
    count = sum(len(v) for v in versions_by_role(workspace).values())

    # act
    printed = call_cli(workspace, "process", "--scenario", SCENARIO)

    # assert
    assert printed.status == 0, printed.err
    assert "no pending requests" in printed.out
    assert (workspace / LEDGER_PATH).read_bytes() == ledger and (workspace / "dvc.lock").read_bytes() == lock
    assert sum(len(v) for v in versions_by_role(workspace).values()) == count


def test_compare_lists_the_versions_and_no_retrain_debt_after_an_exact_reference(resumed):
    # act
    printed = call_cli(resumed.workspace, "compare", "--scenario", SCENARIO)

    # assert
    assert printed.status == 0, printed.err
    lines = printed.out.splitlines()
    table = lines[2:]
    assert lines[0].startswith(f"forget_acc, mia_auc and audit_auc on the forget set of {resumed.receipt.batch_id}")
    assert table[0].split()[:9] == ["version", "aliases", "role", "method", "data_version", "test_acc", "forget_acc",
                                    "mia_auc", "audit_auc"]
    assert set(table[1]) == {"-", " "} and "|" not in "".join(table)  # plain text: columns under a dashed line
    # The original, retired by the exact retrain, has lost its aliases (an empty cell); the retrained one has two.
    original, retrained = (row.split() for row in table[2:4])
    assert (original[1], retrained[2]) == ("original", "retrained")
    assert original[-3:] == ["retired", "by", resumed.receipt.batch_id] and "retired" not in retrained
    # The batch's source and its reference, measured by the batch on its forget set, as its attempts are.
    assert all(cell != "–" for cell in original[5:8] + retrained[6:9]), lines
    assert table[-1].startswith("retrain debt: none")


@dataclass(frozen=True)
class Repaid:
    """A copy of the module's batch with a second receipt, ``batch-approximate``, forgotten only
    approximately: what `compare` said of the debt, what `repay-debt` did, and what a second
    `repay-debt` said."""

    workspace: Path
    exact_batch: str           # the module's batch: forgotten exactly already
    compared: Printed          # `compare` before the repayment
    repaid: Printed            # `repay-debt`
    approximate: Receipt       # batch-approximate's receipt right after it
    exact: Receipt             # the module's batch's receipt right after it
    current: object            # the version alias `current` named right after it (an MLflow ModelVersion)
    again: Printed             # `repay-debt` once more


@pytest.fixture(scope="module")
def repaid(resumed, tmp_path_factory) -> Repaid:
    # arrange
    workspace = copy_workspace(resumed.workspace, tmp_path_factory.mktemp("repaid") / "workspace")
    receipt = resumed.receipt
    approximate = receipt.model_copy(update={"batch_id": "batch-approximate", "forgetting": "interim", "certificate": {
        "method": "puf-special", "guarantee": "empirical only"}})
    write_receipt(workspace, approximate)

    # act: the debt listed, repaid, and asked to be repaid again
    compared = call_cli(workspace, "compare", "--scenario", SCENARIO)
    printed = call_cli(workspace, "repay-debt", "--scenario", SCENARIO)
    left = dict(approximate=read_receipt(workspace, "batch-approximate"),
                exact=read_receipt(workspace, receipt.batch_id),
                current=registry(workspace).get_model_version_by_alias(SCENARIO, "current"))
    again = call_cli(workspace, "repay-debt", "--scenario", SCENARIO)
    return Repaid(workspace, receipt.batch_id, compared, printed, again=again, **left)


def test_a_batch_forgotten_only_approximately_is_listed_as_retrain_debt(repaid):
    # assert
    assert repaid.compared.status == 0, repaid.compared.err
    assert repaid.compared.out.splitlines()[-1].startswith(
        "retrain debt: 1 request(s), 12 sample(s) in 1 batch(es) forgotten only approximately")


def test_repay_debt_retrains_exactly_a_batch_forgotten_only_approximately(repaid, resumed):
    # assert
    assert repaid.repaid.status == 0, repaid.repaid.err
    assert "repaid 1 batch(es)" in repaid.repaid.out
    current = repaid.current
    assert repaid.approximate.exactly_forgotten.version == str(current.version)
    assert current.tags["role"] == "retrained" and current.tags["data_version"] == resumed.after
    assert repaid.exact.exactly_forgotten is None  # exact already: it owed nothing


def test_once_repaid_repay_debt_finds_no_retrain_debt(repaid):
    # assert
    assert repaid.again.status == 0, repaid.again.err
    assert "no retrain debt" in repaid.again.out


def test_a_held_out_deletion_where_the_feature_transform_is_fit_on_the_held_out_split_retrains_exactly(
        workspace, prefect_server):
    """breast_cancer-dfl-ring standardises its features with statistics of the held-out split:
    deleting a held-out row moves every sample's features, so no model of the earlier data version
    may serve the new one (nor keep the deleted row's statistics) — the batch retrains exactly
    instead of keeping the source model as an image scenario's held-out deletion does."""
    # arrange
    scenario = "breast_cancer-dfl-ring"
    cli_ok(workspace, "train", "--scenario", scenario, "--inline")
    held_out = load_horizontal(scenario, workspace).test.sample_ids[:1].tolist()
    cli_ok(workspace, "request", "samples", "--scenario", scenario, "--ids", *held_out)

    # act
    processed = call_cli(workspace, "process", "--scenario", scenario)

    # assert
    assert processed.status == 0, processed.err
    [receipt] = read_receipts(workspace, scenario)
    assert receipt.method == "retrain" and receipt.certificate["guarantee"] == "exact retrain"
    assert [a.method for a in receipt.attempts] == ["retrain"] and "feature transform" in receipt.attempts[0].note
    current = Registry(workspace).client.get_model_version_by_alias(scenario, "current")
    assert current.tags["role"] == "retrained" and current.tags["data_version"] == data_version(workspace, scenario)
    assert str(current.version) == receipt.models["current"].version


def clients() -> list[Tensors]:
    """Two clients of three samples each: c0-0 .. c0-2 and c1-0 .. c1-2."""
    return [Tensors.from_arrays(np.zeros((3, 2)), np.array([0, 1, 1]), np.array([f"c{c}-{i}" for i in range(3)]),
                                "cpu") for c in range(2)]


def sample_request() -> LedgerEntry:
    return LedgerEntry(request_id="a", kind="sample", sample_ids=["c0-1", "c1-2", "test-7"], held_out=["test-7"])


def class_request() -> LedgerEntry:
    return LedgerEntry(request_id="b", kind="class", subject={"label": 1}, sample_ids=["c0-2"])


def test_a_batch_resolves_to_training_samples_per_client_keeping_a_shared_kind():
    # arrange
    record = BatchRecord(batch_id="batch-x", scenario="s", dataset="d", requests=[sample_request(), class_request()])

    # act
    batch = record.forget_set(clients())

    # assert
    assert batch.kind == "sample" and batch.batch_id == "batch-x"
    assert {c: ids.tolist() for c, ids in batch.forget_ids.items()} == {0: ["c0-1", "c0-2"], 1: ["c1-2"]}


def test_a_batch_of_class_requests_alone_forgets_their_labels():
    # arrange
    record = BatchRecord(batch_id="batch-y", scenario="s", dataset="d", requests=[class_request()])

    # act
    classes = record.forget_set(clients())

    # assert
    assert classes.kind == "class" and classes.labels == [1]


def test_a_batch_of_held_out_samples_alone_has_no_forget_set():
    # arrange
    held_out = [LedgerEntry(request_id="c", kind="sample", sample_ids=["t"], held_out=["t"])]
    record = BatchRecord(batch_id="batch-z", scenario="s", dataset="d", requests=held_out)

    # act
    batch = record.forget_set(clients())

    # assert
    assert batch is None


@pytest.mark.parametrize("setting, kind, first, methods", [
    ("hfl", "sample", Attempt(method="puf-special"), ["puf-special", "puf-special", "puf-regular", "fedquit",
                                                      "fedquit", "retrain"]),
    # fedquit takes no class requests, so the class chain goes from the fallback to the retrain.
    ("hfl", "class", Attempt(method="ga"), ["ga", "ga", "puf-regular", "retrain"]),
    # A last resort already chosen first is not tried again with its defaults; its stronger step is.
    ("hfl", "client", Attempt(method="fedquit", options={"rounds": 5}), ["fedquit", "fedquit", "puf-regular",
                                                                         "retrain"]),
    ("vfl", "class", Attempt(method="fedora"), ["fedora", "fedora", "ga", "retrain"]),
], ids=["hfl-sample", "hfl-class", "hfl-client-last-resort-first", "vfl-class"])
def test_the_escalation_policy_tries_a_stronger_step_and_fallbacks_and_ends_with_exact_retrain(setting, kind, first,
                                                                                               methods):
    # act
    policy = default_escalation(setting, kind, first)

    # assert
    assert [a.method for a in policy] == methods


def test_the_escalation_policy_strengthens_the_first_method_and_runs_the_fallbacks_with_their_defaults():
    # act
    policy = default_escalation("hfl", "sample", Attempt(method="puf-special"))

    # assert
    assert policy[1].options == {"eta_u": 4.0, "unlearn_epochs": 2} and policy[3].options == {}


def test_the_dfl_escalation_policy_ends_with_exact_retrain():
    # act
    policy = default_escalation("dfl", "client", Attempt(method="certified-dfu"))

    # assert
    assert [a.method for a in policy][-1] == "retrain"


def test_a_checked_escalation_ends_with_exact_retrain():
    # act
    policy = checked_escalation("hfl", "sample", [Attempt(method="finetune")])

    # assert
    assert [a.method for a in policy] == ["finetune", "retrain"]


def test_the_escalation_policy_refuses_a_method_that_does_not_apply():
    # act
    with pytest.raises(ValueError) as refused:
        default_escalation("vfl", "client", Attempt(method="fedora"))

    # assert
    assert "does not support" in str(refused.value)


@pytest.mark.parametrize("chosen, setting, kind, method", [
    ("auto", "vfl", "class", "fedora"),
    ("auto", "vfl", "sample", "ga"),
    ("auto", "hfl", "sample", "puf-special"),
    ("fedora", "vfl", "sample", "fedora"),
])
def test_fedora_is_the_vfl_default_for_its_own_setting_and_ga_for_sample_requests(chosen, setting, kind, method):
    from flows.process import choose_method

    # act
    chose = choose_method(chosen, setting, kind)

    # assert
    assert chose == method


@pytest.mark.parametrize("chosen, setting, options", [
    (Attempt(method="puf-special", options={"eta_u": 10.0, "unlearn_epochs": 5, "max_recovery_rounds": 20}), "hfl",
     {"eta_u": 20.0, "unlearn_epochs": 10, "max_recovery_rounds": 20}),
    (Attempt(method="ga"), "hfl", {"epochs": 10}),          # from the default, 5
    (Attempt(method="hf-kcu", options={"cg_iterations": 30}), "hfl",
     {"cg_iterations": 60, "hessian": "federation", "beta": None}),
    (Attempt(method="fedora"), "vfl", {"iterations": 120, "omega": 4.0}),
], ids=["puf-special-chosen", "ga-default", "hf-kcu-chosen", "fedora-default"])
def test_the_stronger_step_scales_what_the_first_attempt_chose_never_weakening_it(chosen, setting, options):
    # act
    step = stronger(chosen, setting)

    # assert
    assert step.options == options

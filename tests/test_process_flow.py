"""The ``process-deletions`` flow on digits-hfl through a temporary Prefect server (one for the
module), a real DVC repository and a real sqlite MLflow registry, driven by the CLI: a clean
no-op; a batch that fails after its ledger append and is resumed from the DVC cache (arranged once
for the module: ``resumed``); its attempts gated against a retrained reference and escalated until
one passes (every attempt registered, the receipt listing the chain, ``current`` on a version of
the new data version); a re-run that changes nothing; retrain debt listed and repaid. Then the
typed batch built from the ledger, and the escalation policy, without a server."""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

import flows.process as process_flow
import flows.unlearn as unlearn_stage
from cli import main
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


def cli(workspace, capsys, *args: str) -> str:
    assert main(["--root", str(workspace), *args]) == 0, capsys.readouterr()
    return capsys.readouterr().out


@dataclass
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
    template, _ = trained_workspaces.get(SCENARIO, cli_training(SCENARIO))
    workspace = copy_workspace(template, tmp_path_factory.mktemp("process") / "workspace")

    def run(*args: str) -> Printed:
        printed = call_cli(workspace, *args)
        assert printed.status == 0, printed.err
        return printed

    before = data_version(workspace, SCENARIO)
    ids = run("ids", "--scenario", SCENARIO, "--client", "1", "--limit", "12").out.split()
    request_id = run("request", "samples", "--scenario", SCENARIO, "--ids", *ids).out.strip()
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
        printed = run("process", "--scenario", SCENARIO, "--retrain")
    return Resumed(workspace, ids, request_id, before, crashed, resumed=printed, stages=stages, **left)


# The stages of process-deletions as its module docstring draws them, the debt settled last.
STAGES = ["intake_requests", "apply_deletions", "unlearn_and_register", "promote_and_receipt", "settle_debt"]


def recording(stage, name: str, called: list[str]):
    def record(*args, **kwargs):
        called.append(name)
        return stage(*args, **kwargs)
    return record


def test_with_nothing_pending_a_run_changes_nothing(workspace, prefect_server, capsys):
    out = cli(workspace, capsys, "process", "--scenario", SCENARIO)

    assert out.strip().endswith("no pending requests")
    assert not (workspace / "data/receipts").exists() and not (workspace / "mlflow/mlflow.db").exists()
    assert not (workspace / "dvc.lock").exists()


def test_a_batch_failing_after_its_ledger_append_keeps_the_deletion_and_says_how_to_resume(resumed):
    assert resumed.crashed.status == 1
    assert "error: batch-" in resumed.crashed.err and "batch batch-" not in resumed.crashed.err
    assert "(digits-hfl) failed at unlearn and register:" in resumed.crashed.err
    assert "simulated crash; re-run `fedunlearn process --scenario digits-hfl` to resume" in resumed.crashed.err
    # The deletion itself happened: the ledger holds it and the data moved on without the samples.
    assert resumed.ledger_after_crash == [resumed.request_id]
    assert resumed.after != resumed.before and resumed.roles_after_crash == ["original", "retrained"]
    assert not set(resumed.ids) & resumed.remaining_after_crash


def test_the_resumed_batch_escalates_until_an_attempt_passes_registering_each_once(resumed):
    receipt, workspace = resumed.receipt, resumed.workspace
    roles = versions_by_role(workspace)
    original, [retrained] = roles["original"][0], roles["retrained"]
    attempts = receipt.attempts
    assert receipt.batch_id == retrained.tags["batch_id"]
    assert receipt.request_ids == [resumed.request_id] and receipt.forgotten_per_client == {"1": 12}
    assert (receipt.data_version_before, receipt.data_version_after) == (resumed.before, resumed.after)
    # Every attempt is registered once, in the policy's order, and every one but the last did not pass its gates.
    policy = default_escalation("hfl", "sample", Attempt(method="puf-special"))
    assert [a.attempt for a in attempts] == list(range(len(attempts)))
    assert [a.method for a in attempts] == [a.method for a in policy][:len(attempts)]
    assert all(a.gates.policy == "vs retrained reference" for a in attempts if a.gates)
    assert all(not a.passed for a in attempts[:-1]) and attempts[-1].passed
    unlearned = {int(v.tags["attempt"]): v for v in roles.get("unlearned", [])}
    registered = {a.attempt: a.version.version for a in attempts}
    assert {n: str(v.version) for n, v in unlearned.items()} == {n: v for n, v in registered.items()
                                                                if attempts[n].method != "retrain"}
    assert all(v.tags["batch_id"] == receipt.batch_id and v.tags["data_version"] == resumed.after and
               v.tags["source_version"] == str(original.version) for v in unlearned.values())


def test_current_is_the_passing_attempt_a_version_of_the_new_data_version(resumed, tmp_path):
    receipt, workspace = resumed.receipt, resumed.workspace
    attempts, batch_id = receipt.attempts, receipt.batch_id
    current = registry(workspace).get_model_version_by_alias(SCENARIO, "current")
    assert current.tags["data_version"] == resumed.after and str(current.version) == attempts[-1].version.version
    assert receipt.promoted and receipt.models["current"].version == str(current.version)
    out = resumed.resumed.out
    assert f"receipt: data/receipts/{batch_id}.json" in out and f"alias current -> v{current.version}" in out
    artifacts = [a.path for a in registry(workspace).list_artifacts(current.run_id, "receipt")]
    assert artifacts == [f"receipt/{batch_id}.json"]
    unlearned = {int(v.tags["attempt"]): v for v in versions_by_role(workspace).get("unlearned", [])}
    certificate = registry(workspace).download_artifacts(unlearned[0].run_id, "certificate.json", str(tmp_path))
    assert json.loads(Path(certificate).read_text())["guarantee"] == "empirical only"


def test_the_batch_runs_its_stages_in_the_order_of_the_flow_diagram(resumed):
    assert resumed.stages == STAGES


def test_every_version_logs_the_same_metrics_and_the_reference_the_forget_accuracy(resumed):
    roles = versions_by_role(resumed.workspace)
    original, [retrained] = roles["original"][0], roles["retrained"]
    for version in [original, retrained, *roles.get("unlearned", [])]:
        assert set(VERSION_METRICS) <= set(registry(resumed.workspace).get_run(version.run_id).data.metrics)
    # The batch's source is measured on the batch's forget set too (issue 37): its own figure, logged on its run.
    source_forget = registry(resumed.workspace).get_run(original.run_id).data.metrics["forget_acc"]
    assert source_forget == resumed.receipt.metrics["source"]["forget_acc"] and not math.isnan(source_forget)
    assert not math.isnan(registry(resumed.workspace).get_run(retrained.run_id).data.metrics["forget_acc"])


def test_each_version_names_its_data_version_and_the_batch_that_put_it_there(resumed):
    """Lineage in MLflow: each version's run has its data version as a dataset input (digest = the
    DVC hash, source = the partition), and its description says which batch put it there and why."""
    receipt, workspace, before, after = resumed.receipt, resumed.workspace, resumed.before, resumed.after
    roles = versions_by_role(workspace)
    original, [retrained], unlearned = roles["original"][0], roles["retrained"], roles.get("unlearned", [])
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
        assert (f"gates: **{attempt.gates.verdict}**" if attempt.gates else "gates: none needed") in description
        assert all(c.name in description for c in (attempt.gates.checks if attempt.gates else []))
        assert not any(i in description for i in resumed.ids)  # counts only, never a sample ID
    assert receipt.batch_id in lineage.version(SCENARIO, retrained.version).description
    [audit_set] = lineage.versions(f"{SCENARIO}-audit")  # trained by the batch on the new data's held-out split
    assert lineage.data_inputs(audit_set.run_id) == [(after, partition, "audit-reference")]


def test_the_shadow_model_trained_by_the_failed_run_is_read_back_by_the_resumed_one(resumed):
    assert len(list((resumed.workspace / ".cache/shadow-models").glob(f"{SCENARIO}-*.pt"))) == 1


def test_a_rerun_after_the_batch_changes_nothing(resumed, tmp_path, capsys):
    workspace = copy_workspace(resumed.workspace, tmp_path / "workspace")
    ledger, lock = (workspace / LEDGER_PATH).read_bytes(), (workspace / "dvc.lock").read_bytes()
    count = sum(len(v) for v in versions_by_role(workspace).values())

    out = cli(workspace, capsys, "process", "--scenario", SCENARIO)

    assert "no pending requests" in out
    assert (workspace / LEDGER_PATH).read_bytes() == ledger and (workspace / "dvc.lock").read_bytes() == lock
    assert sum(len(v) for v in versions_by_role(workspace).values()) == count


def test_compare_lists_the_versions_and_no_retrain_debt_after_an_exact_reference(resumed, capsys):
    lines = cli(resumed.workspace, capsys, "compare", "--scenario", SCENARIO).splitlines()
    table = lines[2:]

    assert lines[0].startswith(f"forget_acc, mia_auc and audit_auc on the forget set of {resumed.receipt.batch_id}")
    assert table[0].split()[:9] == ["version", "aliases", "role", "method", "data_version", "test_acc", "forget_acc",
                                    "mia_auc", "audit_auc"]
    assert set(table[1]) == {"-", " "} and "|" not in "".join(table)  # plain text: columns under a dashed line
    rows = [row.split() for row in table[2:4]]  # original and retrained: both have an alias, so no empty cell
    assert [row[2] for row in rows] == ["original", "retrained"]
    # The batch's source and its reference, measured by the batch on its forget set, as its attempts are.
    assert all(cell != "–" for row in rows for cell in row[6:9]), lines
    assert table[-1].startswith("retrain debt: none")


def test_a_batch_forgotten_only_approximately_is_retrain_debt_until_repay_debt_retrains(resumed, tmp_path, capsys):
    workspace = copy_workspace(resumed.workspace, tmp_path / "workspace")
    receipt = resumed.receipt
    approximate = receipt.model_copy(update={"batch_id": "batch-approximate", "forgetting": "interim", "certificate": {
        "method": "puf-special", "guarantee": "empirical only"}})
    write_receipt(workspace, approximate)
    assert cli(workspace, capsys, "compare", "--scenario", SCENARIO).splitlines()[-1].startswith(
        "retrain debt: 1 request(s), 12 sample(s) in 1 batch(es) forgotten only approximately")

    out = cli(workspace, capsys, "repay-debt", "--scenario", SCENARIO)

    assert "repaid 1 batch(es)" in out
    repaid = read_receipt(workspace, "batch-approximate").exactly_forgotten
    current = registry(workspace).get_model_version_by_alias(SCENARIO, "current")
    assert repaid.version == str(current.version) and current.tags["role"] == "retrained"
    assert current.tags["data_version"] == resumed.after
    assert read_receipt(workspace, receipt.batch_id).exactly_forgotten is None  # exact already: it owed nothing
    assert "no retrain debt" in cli(workspace, capsys, "repay-debt", "--scenario", SCENARIO)


def test_a_held_out_deletion_where_the_feature_transform_is_fit_on_the_held_out_split_retrains_exactly(
        workspace, prefect_server, capsys):
    """breast_cancer-dfl-ring standardises its features with statistics of the held-out split:
    deleting a held-out row moves every sample's features, so no model of the earlier data version
    may serve the new one (nor keep the deleted row's statistics) — the batch retrains exactly
    instead of keeping the source model as an image scenario's held-out deletion does."""
    scenario = "breast_cancer-dfl-ring"
    assert main(["--root", str(workspace), "train", "--scenario", scenario, "--inline"]) == 0
    held_out = load_horizontal(scenario, workspace).test.sample_ids[:1].tolist()
    assert main(["--root", str(workspace), "request", "samples", "--scenario", scenario, "--ids", *held_out]) == 0
    capsys.readouterr()
    assert main(["--root", str(workspace), "process", "--scenario", scenario]) == 0
    [receipt] = read_receipts(workspace, scenario)
    assert receipt.method == "retrain" and receipt.certificate["guarantee"] == "exact retrain"
    assert [a.method for a in receipt.attempts] == ["retrain"] and "feature transform" in receipt.attempts[0].note
    current = Registry(workspace).client.get_model_version_by_alias(scenario, "current")
    assert current.tags["role"] == "retrained" and current.tags["data_version"] == data_version(workspace, scenario)
    assert str(current.version) == receipt.models["current"].version


def test_a_batch_resolves_to_training_samples_per_client_keeping_a_shared_kind():
    clients = [Tensors.from_arrays(np.zeros((3, 2)), np.array([0, 1, 1]), np.array([f"c{c}-{i}" for i in range(3)]),
                                   "cpu") for c in range(2)]
    entries = [LedgerEntry(request_id="a", kind="sample", sample_ids=["c0-1", "c1-2", "test-7"], held_out=["test-7"]),
               LedgerEntry(request_id="b", kind="class", subject={"label": 1}, sample_ids=["c0-2"])]
    record = BatchRecord(batch_id="batch-x", scenario="s", dataset="d", requests=entries)
    batch = record.forget_set(clients)
    assert batch.kind == "sample" and batch.batch_id == "batch-x"
    assert {c: ids.tolist() for c, ids in batch.forget_ids.items()} == {0: ["c0-1", "c0-2"], 1: ["c1-2"]}
    classes = BatchRecord(batch_id="batch-y", scenario="s", dataset="d", requests=entries[1:]).forget_set(clients)
    assert classes.kind == "class" and classes.labels == [1]
    held_out = [LedgerEntry(request_id="c", kind="sample", sample_ids=["t"], held_out=["t"])]
    assert BatchRecord(batch_id="batch-z", scenario="s", dataset="d", requests=held_out).forget_set(clients) is None


def test_the_escalation_policy_ends_with_exact_retrain_and_refuses_what_does_not_apply():
    policy = default_escalation("hfl", "sample", Attempt(method="puf-special"))
    assert [a.method for a in policy] == ["puf-special", "puf-special", "puf-regular", "fedquit", "retrain"]
    assert policy[1].options == {"eta_u": 4.0, "unlearn_epochs": 2} and policy[3].options == {}
    # fedquit takes no class requests, so the class chain goes from the fallback to the retrain.
    assert [a.method for a in default_escalation("hfl", "class", Attempt(method="ga"))] == ["ga", "ga", "puf-regular",
                                                                                       "retrain"]
    # A last resort already chosen first is not tried again with its defaults.
    assert [a.method for a in default_escalation("hfl", "client", Attempt(method="fedquit", options={"rounds": 5}))] == \
        ["fedquit", "puf-regular", "retrain"]
    assert [a.method for a in default_escalation("vfl", "class", Attempt(method="fedora"))] == ["fedora", "fedora", "ga",
                                                                                           "retrain"]
    assert [a.method for a in default_escalation("dfl", "client", Attempt(method="certified-dfu"))][-1] == "retrain"
    assert [a.method for a in checked_escalation("hfl", "sample", [Attempt(method="finetune")])] == ["finetune", "retrain"]
    with pytest.raises(ValueError, match="does not support"):
        default_escalation("vfl", "client", Attempt(method="fedora"))


def test_fedora_is_the_vfl_default_for_its_own_setting_and_ga_for_sample_requests():
    from flows.process import choose_method

    assert choose_method("auto", "vfl", "class") == "fedora" and choose_method("auto", "vfl", "sample") == "ga"
    assert choose_method("auto", "hfl", "sample") == "puf-special" and choose_method("fedora", "vfl", "sample") == "fedora"


def test_the_stronger_step_scales_what_the_first_attempt_chose_never_weakening_it():
    chosen = Attempt(method="puf-special", options={"eta_u": 10.0, "unlearn_epochs": 5, "max_recovery_rounds": 20})
    assert stronger(chosen, "hfl").options == {"eta_u": 20.0, "unlearn_epochs": 10, "max_recovery_rounds": 20}
    assert stronger(Attempt(method="ga"), "hfl").options == {"epochs": 10}          # from the default, 5
    kcu = stronger(Attempt(method="hf-kcu", options={"cg_iterations": 30}), "hfl").options
    assert kcu == {"cg_iterations": 60, "hessian": "federation", "beta": None}
    assert stronger(Attempt(method="fedora"), "vfl").options == {"iterations": 120, "omega": 4.0}

"""The benchmark: request specs, and the output schema of a real (small) run through the flow."""

import json

import mlflow
import numpy as np
import pytest
import torch

from fedunlearn.benchmark.spec import parse_request
from fedunlearn.evaluation.records import ROW_KEYS
from fedunlearn.federation.local import Tensors
from stores.registry import tracking_uri


def clients(sizes=(5, 9, 3)) -> list[Tensors]:
    out, offset = [], 0
    for size in sizes:
        ids = np.array([f"s-{offset + i}" for i in range(size)])
        out.append(Tensors.from_arrays(np.zeros((size, 2)), np.arange(size) % 3, ids, torch.device("cpu")))
        offset += size
    return out


def test_request_specs_resolve_to_forget_ids():
    assert parse_request("client:largest").resolve(clients(), 3, 0).forget_ids.keys() == {1}
    batch = parse_request("client:0,2").resolve(clients(), 3, 0)
    assert batch.kind == "client" and batch.num_forget == 8
    assert parse_request("class:1").resolve(clients(), 3, 0).num_forget == 2 + 3 + 1
    fraction = parse_request("samples:0.5@all").resolve(clients(), 3, 0)
    assert fraction.kind == "sample" and {c: len(v) for c, v in fraction.forget_ids.items()} == {0: 2, 1: 4, 2: 2}
    assert parse_request("samples:1@largest").resolve(clients(), 3, 0).num_forget == 9


@pytest.mark.parametrize("bad", ["client:", "client:x", "class:-1", "samples:0.1", "samples:1.5@all", "users:3"])
def test_malformed_specs_name_the_accepted_forms(bad):
    with pytest.raises(ValueError, match="client:<id>|fraction must be in"):
        parse_request(bad)


def test_unknown_client_or_class_in_a_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown client 7"):
        parse_request("client:7").resolve(clients(), 3, 0)
    with pytest.raises(ValueError, match=r"class label\(s\) \[5\] out of range"):
        parse_request("class:5").resolve(clients(), 3, 0)


@pytest.mark.reliability  # slow end to end: `make reliability`
def test_benchmark_writes_rows_plots_certificates_and_mlflow_runs(workspace, prefect_server, tmp_path):
    from flows.benchmark import benchmark

    out = tmp_path / "bench"
    # Trained long enough that the original learns the trigger it carries (2 rounds do not, with momentum).
    params = workspace / "params.yaml"
    params.write_text(params.read_text().replace("train: {rounds: 2, local_epochs: 3, lr: 0.05, momentum: 0.9",
                                                 "train: {rounds: 6, local_epochs: 3, lr: 0.05, momentum: 0.9", 1))
    rows = benchmark(scenario="digits-hfl", request="client:largest", methods="ga,finetune", out=str(out),
                     backdoor=True, root=str(workspace),
                     method_options={"finetune": {"rounds": 1}, "ga": {"recovery_rounds": 1}}).rows
    assert [r["method"] for r in rows] == ["original", "retrain", "ga", "finetune"]
    saved = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in saved] == [r["method"] for r in rows]
    for row in saved:
        assert set(ROW_KEYS) <= set(row)
        assert row["scenario"] == "digits-hfl" and row["request"] == "client:largest"
        for attack in ("confidence", "loss", "shadow"):
            assert 0.0 <= row[f"mia_{attack}_auc"] <= 1.0 and 0.0 <= row[f"mia_{attack}_tpr_at_1fpr"] <= 1.0
        assert row["mia_auc"] == max(row[f"mia_{a}_auc"] for a in ("confidence", "loss", "shadow"))
        assert 0.0 <= row["bd_asr"] <= 1.0
    by_method = {r["method"]: r for r in saved}
    assert by_method["original"]["certificate"] == "not certified"
    assert by_method["retrain"]["certificate"] == "exact retrain" and by_method["retrain"]["speedup_vs_retrain"] == 1
    assert by_method["ga"]["certificate"] == "empirical only"
    # The retrained model never saw the forget samples, so the trained-in backdoor is the original's alone.
    assert by_method["original"]["forget_acc"] > by_method["retrain"]["forget_acc"]
    for name in ("results.md", "accuracy_over_rounds.png", "attack_roc.png", "gap_to_retrain.png",
                 "certificates/ga.json"):
        assert (out / name).is_file(), name
    client = mlflow.MlflowClient(tracking_uri=tracking_uri(workspace))
    experiment = client.get_experiment_by_name("benchmark-digits-hfl")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if r.data.tags.get("role") == "benchmark-row"]
    assert sorted(r.data.tags["method"] for r in children) == ["finetune", "ga", "original", "retrain"]
    assert all({"test_acc", "forget_acc", "mia_auc", "wall_seconds"} <= set(r.data.metrics) for r in children)
    # A second run reuses the original model instead of training it again.
    again = benchmark(scenario="digits-hfl", request="client:largest", methods="finetune", out=str(out),
                      backdoor=True, root=str(workspace), method_options={"finetune": {"rounds": 1}}).rows
    assert again[0]["notes"] == {"reused": True}
    assert again[0]["test_acc"] == pytest.approx(by_method["original"]["test_acc"])


def test_unsupported_method_for_the_request_is_rejected_before_training():
    from flows.benchmark import select_methods

    with pytest.raises(ValueError, match=r"method\(s\) \['nope'\] do not support hfl client requests"):
        select_methods("ga,nope", "hfl", "client")
    assert "retrain" not in select_methods("all", "hfl", "client")


def test_ulira_audit_of_exact_retraining_is_near_chance(workspace):
    """Retraining really forgets: the per-example audit cannot tell its unlearned samples from
    samples it never saw."""
    from fedunlearn.benchmark import yardstick
    from fedunlearn.config import load_params
    from fedunlearn.training import load_federation
    from fedunlearn.unlearning import get_method
    from stores.workspace import reproduce

    reproduce(workspace, "digits-hfl")
    fed_state = load_federation("digits-hfl", load_params(workspace / "params.yaml"), workspace, torch.device("cpu"))
    setup = yardstick.build_setup("digits-hfl", fed_state, parse_request("samples:0.1@all"))
    result = yardstick.ulira(setup, lambda: get_method("retrain", setting="hfl"), num_pairs=2)
    assert result.name == "ulira"
    assert 0.35 < result.auc < 0.65


@pytest.mark.parametrize("scenario,request_spec,expected", [
    ("wine-vfl", "class:1", {"retrain": "exact retrain", "fedora": "constraint satisfied"}),
    ("breast_cancer-dfl-ring", "samples:0.05@all", {"retrain": "exact retrain", "certified-dfu": "formal (ε,δ)"}),
])
def test_every_setting_runs_through_the_same_benchmark_core(workspace, scenario, request_spec, expected):
    from fedunlearn.benchmark import yardstick
    from fedunlearn.config import load_params
    from fedunlearn.training import load_federation, prepare_unlearning, trained
    from tasks.unlearning import build_method
    from stores.workspace import reproduce

    reproduce(workspace, scenario)
    fed_state = load_federation(scenario, load_params(workspace / "params.yaml"), workspace, torch.device("cpu"))
    setup = yardstick.build_setup(scenario, fed_state, parse_request(request_spec))
    original = yardstick.train_original(setup)
    prepare_unlearning(trained(setup.fed_state, original))
    evaluator = setup.evaluator()
    before = evaluator.evaluate(setup.fed_state.model_from(original.state))
    for name, guarantee in expected.items():
        method = build_method(name, fed_state.setting, setup.forget_set.kind, None, {})
        outcome = yardstick.run_method(setup, original.state, method)
        after = evaluator.evaluate(setup.fed_state.model_from(outcome.state))
        assert yardstick.method_certificate(setup, method, outcome).guarantee == guarantee
        assert set(after.evidence.attacks) == {"confidence", "loss", "shadow"}
        assert outcome.cost.wall_seconds > 0 and after.test_acc > 0.5
    if setup.forget_set.labels:  # class removal: the forgotten class is no longer recognised
        assert before.extra["forgotten_classes_test_acc"] > 0.8 > after.extra["forgotten_classes_test_acc"]


def test_short_runs_are_timed_several_times_and_report_the_median_with_the_first_outcome():
    import dataclasses

    from fedunlearn.benchmark.yardstick import run_method
    from fedunlearn.federation.cost import Cost
    from fedunlearn.unlearning.base import Outcome

    @dataclasses.dataclass
    class Federation:
        state: dict

    class Timed:
        """Reports the wall times it is given, one per call, and which call produced the outcome."""

        def __init__(self, seconds):
            self.seconds, self.calls = list(seconds), 0

        def unlearn(self, fed_state, forget_set):
            self.calls += 1
            return Outcome({"call": self.calls}, Cost(wall_seconds=self.seconds[self.calls - 1]))

    setup = type("Setup", (), {"fed_state": Federation({}), "forget_set": None})()
    fast = Timed([0.09, 0.03, 0.02, 0.5, 0.025])
    outcome = run_method(setup, {}, fast, timings=5)
    assert fast.calls == 5 and outcome.state == {"call": 1} and outcome.cost.wall_seconds == 0.03
    assert outcome.notes["wall_seconds_runs"] == [0.09, 0.03, 0.02, 0.5, 0.025]
    slow = Timed([1.5])
    assert run_method(setup, {}, slow, timings=5).cost.wall_seconds == 1.5 and slow.calls == 1
    once = Timed([0.01])
    assert run_method(setup, {}, once).cost.wall_seconds == 0.01 and once.calls == 1  # the deletion pipeline


def test_a_scenarios_threads_apply_inside_the_block_and_are_restored_after():
    from fedunlearn.device import intra_op_threads

    before = torch.get_num_threads()
    with intra_op_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with intra_op_threads(None):
        assert torch.get_num_threads() == before

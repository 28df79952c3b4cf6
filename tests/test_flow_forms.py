"""The Prefect UI's run forms: every parameter of a served flow says what it is and what leaving it
empty means (Prefect reads the flow's Args and pydantic Field descriptions), so no field reads only
"(Optional)" (issue 37, "forms and names"); and every served deployment has a name of its own that says
what it does."""

import pytest
from prefect.utilities.callables import parameter_schema

from flows.audit import audit_references
from flows.benchmark import benchmark
from flows.debt import repay_retrain_debt
from flows.process import process_deletions
from flows.reference import retrain_reference
from flows.submit import submit_deletion_requests
from flows.train import train_federated


@pytest.mark.parametrize("served", [process_deletions, submit_deletion_requests, retrain_reference, train_federated,
                                    repay_retrain_debt, audit_references, benchmark], ids=lambda f: f.name)
def test_every_form_field_is_described(served):
    schema = parameter_schema(served.fn)
    assert schema.properties
    assert [name for name, field in schema.properties.items() if not field.get("description")] == []


def test_the_batch_form_says_what_an_empty_policy_or_gate_means():
    fields = parameter_schema(process_deletions.fn).properties
    assert "params.yaml" in fields["forgetting_policy"]["description"]
    assert "defaults" in fields["gates"]["description"]


def test_every_flow_served_is_covered_here_and_each_deployment_has_a_name_of_its_own(tmp_path):
    from pathlib import Path

    from flows.serve import build_deployments

    (tmp_path / "params.yaml").write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    served = build_deployments(tmp_path, "digits-hfl", "0 2 * * *")
    names = [settings["name"] for _, settings in served]
    assert len(set(names)) == len(names) and "on-demand" not in names, names
    covered = {f.name for f in (process_deletions, submit_deletion_requests, retrain_reference, train_federated,
                                repay_retrain_debt, audit_references, benchmark)}
    assert {flow.name for flow, _ in served} == covered
    assert "benchmark/all-methods" in {f"{flow.name}/{settings['name']}" for flow, settings in served}

"""The Prefect UI's run forms: every parameter of a served flow says what it is and what leaving it
empty means (Prefect reads the flow's Args and pydantic Field descriptions), so no field reads only
"(Optional)" (issue 37, "forms and names"). The benchmark flow's form is not covered yet."""

import pytest
from prefect.utilities.callables import parameter_schema

from flows.audit import audit_references
from flows.debt import repay_retrain_debt
from flows.process import process_deletions
from flows.reference import retrain_reference
from flows.submit import submit_deletion_requests
from flows.train import train_federated


@pytest.mark.parametrize("served", [process_deletions, submit_deletion_requests, retrain_reference, train_federated,
                                    repay_retrain_debt, audit_references], ids=lambda f: f.name)
def test_every_form_field_is_described(served):
    schema = parameter_schema(served.fn)
    assert schema.properties
    assert [name for name, field in schema.properties.items() if not field.get("description")] == []


def test_the_batch_form_says_what_an_empty_policy_or_gate_means():
    fields = parameter_schema(process_deletions.fn).properties
    assert "params.yaml" in fields["forgetting_policy"]["description"]
    assert "defaults" in fields["gates"]["description"]

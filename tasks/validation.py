"""Prefect tasks that validate deletion requests: the Great Expectations suite for the tabular
request checks, then the batch plan.

The suite validates the request table against the current data version: sample IDs exist and
are not already deleted, class labels are in range, clients exist. Each failure is traced back
to the requests that hold the unexpected values, which are quarantined with the reason; the
rest of the batch proceeds. The domain rules that need more than a column (a class or client
with nothing left to delete, client requests in VFL) apply while resolving the batch plan.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.requests.batch import BatchPlan, PendingRequest, Rejection, new_batch_id, plan_batch
from fedunlearn.requests.catalog import Catalog, load_catalog
from fedunlearn.requests.ledger import LEDGER_PATH
from fedunlearn.requests.model import DeletionRequestModel, RequestKind
from stores.validation import ValidationFailed, validate_frame
from stores.workspace import Workspace


@dataclass(frozen=True)
class SubjectCheck:
    """One expectation over a column of a request table, and how to explain its failure in the
    values of the column ``shown`` (by default the checked column itself)."""

    table: str
    column: str
    expectation: Any
    explain: Callable[[list], str]
    shown: str | None = None


def _listing(values: list) -> str:
    shown = ", ".join(str(v) for v in values[:10])
    return shown + (f" and {len(values) - 10} more" if len(values) > 10 else "")


def subject_checks(catalog: Catalog, deleted: set[str], data_version: str) -> list[SubjectCheck]:
    """The suite. Membership of a sample ID in the data or in the ledger is looked up in pandas
    (``request_tables`` adds the columns ``known`` and ``not_deleted``) and the expectations check
    those flags: handing GX the set of every sample ID would cost time in the size of the whole
    dataset for a batch of one request."""
    import great_expectations as gx

    # GX pins this logger to INFO and announces a temporary docs folder for every ephemeral context.
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    expect, scenario, last_class = gx.expectations, catalog.scenario, catalog.num_classes - 1
    # Deleted IDs count as known here: the not-deleted check gives them a clearer reason.
    exists = expect.ExpectColumnValuesToBeInSet(column="known", value_set=[True])
    in_range = expect.ExpectColumnValuesToBeBetween(column="label", min_value=0, max_value=last_class)
    checks = [
        SubjectCheck("sample_ids", "known", exists,
                     lambda ids: f"unknown sample IDs, not in data version {data_version} of {scenario} (list the "
                                 f"valid ones with `fedunlearn ids --scenario {scenario}`): {_listing(ids)}",
                     shown="sample_id"),
        SubjectCheck("labels", "label", in_range,
                     lambda labels: f"class {labels[0]} is out of range: {scenario} has classes 0..{last_class}"),
    ]
    if deleted:
        not_deleted = expect.ExpectColumnValuesToBeInSet(column="not_deleted", value_set=[True])
        checks.append(SubjectCheck("sample_ids", "not_deleted", not_deleted,
                                   lambda ids: f"already deleted (listed in {LEDGER_PATH}): {_listing(ids)}",
                                   shown="sample_id"))
    if catalog.clients:
        client_exists = expect.ExpectColumnValuesToBeInSet(column="client", value_set=list(catalog.clients))
        checks.append(SubjectCheck("clients", "client", client_exists,
                                   lambda clients: f"unknown client {clients[0]}: {scenario} has clients "
                                                   f"{catalog.clients[0]}..{catalog.clients[-1]}"))
    return checks


def request_tables(pending: list[PendingRequest], catalog: Catalog, deleted: set[str]) -> dict[str, pd.DataFrame]:
    """One row per requested sample ID (with whether the data or the ledger knows it), class
    label or client, with its request ID."""
    rows: dict[str, list[dict]] = {"sample_ids": [], "labels": [], "clients": []}
    for item in pending:
        request = item.request
        if request.kind is RequestKind.SAMPLE:
            rows["sample_ids"] += [{"request_id": request.request_id, "sample_id": i} for i in request.sample_ids]
        elif request.kind is RequestKind.CLASS:
            rows["labels"].append({"request_id": request.request_id, "label": request.label})
        else:
            rows["clients"].append({"request_id": request.request_id, "client": request.client})
    tables = {name: pd.DataFrame(table) for name, table in rows.items() if table}
    if "sample_ids" in tables:
        ids = tables["sample_ids"]["sample_id"]
        deleted_now = ids.map(deleted.__contains__).astype(bool)  # lookups: the cost of the request, not the data
        tables["sample_ids"]["not_deleted"] = ~deleted_now
        tables["sample_ids"]["known"] = ids.map(catalog.labels.__contains__).astype(bool) | deleted_now
    return tables


def _failing_requests(tables: dict[str, pd.DataFrame], checks: list[SubjectCheck]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, frame in tables.items():
        table_checks = [c for c in checks if c.table == name]
        if not table_checks:
            continue
        for failure in validate_frame(frame, f"requests-{name}", [c.expectation for c in table_checks]):
            check = next(c for c in table_checks
                         if (c.expectation.expectation_type, c.column) == (failure.expectation, failure.column))
            failing = frame[frame[check.column].isin(failure.examples)]
            if failing.empty:
                raise ValidationFailed(f"request table failed {failure}, and no request holds those values")
            for request_id, values in failing.groupby("request_id")[check.shown or check.column]:
                found.setdefault(request_id, []).append(check.explain(sorted(set(values.tolist()))))
    return found


def check_subjects(pending: list[PendingRequest], catalog: Catalog, deleted: set[str],
                   data_version: str) -> dict[str, str]:
    """request_id → reason for every request failing the suite. GX lists at most 20 unexpected
    values per expectation: the requests holding them are set aside and the rest validated again."""
    reasons: dict[str, list[str]] = {}
    remaining = list(pending)
    while remaining:
        found = _failing_requests(request_tables(remaining, catalog, deleted),
                                 subject_checks(catalog, deleted, data_version))
        if not found:
            break
        for request_id, lines in found.items():
            reasons.setdefault(request_id, []).extend(lines)
        remaining = [p for p in remaining if p.request.request_id not in found]
    for item in pending:
        note = live_ids_note(item.request, catalog, deleted) if item.request.request_id in reasons else None
        if note:
            reasons[item.request.request_id].append(note)
    return {request_id: "; ".join(lines) for request_id, lines in reasons.items()}


def live_ids_note(request: DeletionRequestModel, catalog: Catalog, deleted: set[str]) -> str | None:
    """For a sample request refused because some of its IDs are already deleted: a request is applied
    whole or not at all, so its live IDs stay in the data — said, with what to do about them."""
    if request.kind is not RequestKind.SAMPLE or not deleted.intersection(request.sample_ids):
        return None
    live = [i for i in request.sample_ids if i not in deleted and i in catalog.labels]
    if not live:
        return "every ID it names is already deleted: nothing is left to delete"
    return (f"its other {len(live)} ID(s) are live and stay in the data, since a request is applied whole or not "
            f"at all: {_listing(live)}. To delete them, submit a new request naming only those IDs")


@task(name="validate-requests", cache_policy=NO_CACHE)
def validate_requests(ws: Workspace, scenario: str, pending: list[PendingRequest]) -> BatchPlan:
    """The GX suite, then the batch plan (domain rules, duplicates merged)."""
    if not pending:  # nothing to check, so the data need not even be prepared
        return BatchPlan(new_batch_id(), scenario, ws.params.scenario(scenario).dataset,
                         [], {}, [])
    deleted = ws.ledger.deleted_ids()
    catalog = load_catalog(scenario, ws.root, deleted)
    reasons = check_subjects(pending, catalog, deleted, ws.data_version(scenario))
    plan = plan_batch(new_batch_id(), [p for p in pending if p.request.request_id not in reasons], catalog)
    plan.rejected += [Rejection(p.items, reasons[p.request.request_id], p.request.request_id)
                      for p in pending if p.request.request_id in reasons]
    return plan

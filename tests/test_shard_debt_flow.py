"""Retrain debt per shard through the commands (issue 48, item 3; fedunlearn/shard_debt.py), on a
digits federation in 2 shards with an injected clock: a monthly request of one shard's client and an
urgent one of the other shard's are forgotten on the interim tier; the repayment started at the urgent
request's latest safe start (``repay-debt --only-due``, as the run a batch schedules) retrains the
urgent shard alone and keeps the other shard's model as it served; the weekly repayment then retrains
the shard still owed and reuses the one retrained already."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

from fedunlearn.receipts import Receipt, read_receipt, read_receipts
from fedunlearn.requests.model import CLOCK_VARIABLE
from fedunlearn.sharded_federation import assign_shards
from models.ensemble import split_state
from stores.registry import Registry
from stores.workspace import Workspace
from tasks.data import read_federation
from workspaces import Printed, add_sharded_digits, call_cli, init_workspace_at

SCENARIO = "digits-shards-hfl"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def at(when: datetime, workspace: Path, *args: str) -> Printed:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CLOCK_VARIABLE, when.isoformat())
        return call_cli(workspace, *args)


def ok(when: datetime, workspace: Path, *args: str) -> str:
    printed = at(when, workspace, *args)
    assert printed.status == 0, printed.err + printed.out
    return printed.out


def request(workspace: Path, client: int, when: datetime, deadline: datetime | None = None) -> str:
    ids = ok(when, workspace, "ids", "--scenario", SCENARIO, "--client", str(client), "--limit", "6").split()
    extra = ["--deadline", deadline.isoformat()] if deadline else []
    return ok(when, workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids, *extra).strip()


@dataclass(frozen=True)
class ShardDebt:
    workspace: Path
    shard_of: tuple[int, ...]
    monthly: Receipt                 # client of shard 0, default deadline
    urgent: Receipt                  # client of shard 1, due in two days
    not_due: Printed                 # `repay-debt --only-due` before any latest safe start
    partial: Printed                 # `repay-debt --only-due` at the urgent request's latest safe start
    partial_version: object          # the version it registered (an MLflow ModelVersion)
    served_before: object            # the version current named before it
    monthly_after_partial: Receipt
    urgent_after_partial: Receipt
    weekly: Printed                  # `repay-debt` (the weekly run) afterwards
    weekly_version: object
    monthly_after_weekly: Receipt
    kept_as_served: bool             # the partial version's shard 0 is, bit for bit, the one that served
    flops_share: float               # the partial repayment's training FLOPs ÷ the original's (every shard)
    shard_share: float               # shard 1's share of the training samples at the partial repayment


@pytest.fixture(scope="module")
def shard_debt(prefect_server, tmp_path_factory) -> ShardDebt:
    # arrange: the sharded scenario trained; a client of each shard
    root = init_workspace_at(tmp_path_factory.mktemp("shard-debt") / "ws")
    add_sharded_digits(root, SCENARIO, rounds=1)
    ok(T0 - timedelta(hours=2), root, "train", "--scenario", SCENARIO, "--inline")
    ws = Workspace.open(root)
    shard_of = assign_shards(4, 2, ws.params.seed)
    first = {s: shard_of.index(s) for s in (0, 1)}

    # act: two interim batches, then the repayments as Prefect would start them
    monthly_id = request(root, first[0], T0)
    ok(T0, root, "process", "--scenario", SCENARIO)
    later = T0 + timedelta(hours=1)
    urgent_id = request(root, first[1], later, deadline=later + timedelta(days=4))
    ok(later, root, "process", "--scenario", SCENARIO)
    receipts = {r.request_ids[0]: r for r in read_receipts(root, SCENARIO)}
    monthly, urgent = receipts[monthly_id], receipts[urgent_id]
    not_due = at(later + timedelta(minutes=5), root, "repay-debt", "--scenario", SCENARIO, "--only-due")
    registry = Registry(root)
    served_before = registry.by_alias(SCENARIO, "current")
    partial = at(urgent.exact_start_by, root, "repay-debt", "--scenario", SCENARIO, "--only-due")
    partial_version = registry.by_alias(SCENARIO, "current")
    monthly_after_partial, urgent_after_partial = (read_receipt(root, monthly.batch_id),
                                                   read_receipt(root, urgent.batch_id))
    kept = split_state(registry.load(SCENARIO, partial_version.version).state, 2)[0]
    served = split_state(registry.load(SCENARIO, served_before.version).state, 2)[0]
    kept_as_served = kept.keys() == served.keys() and all(torch.equal(kept[k], served[k]) for k in kept)
    flops = {str(v): registry.metrics(registry.version(SCENARIO, str(v)).run_id)["flops"]
             for v in (1, partial_version.version)}
    federation = read_federation(ws, SCENARIO, torch.device("cpu"))
    sizes = [sum(len(c) for c in federation.shard(k, {}).clients) for k in (0, 1)]
    weekly = at(urgent.exact_start_by + timedelta(days=1), root, "repay-debt", "--scenario", SCENARIO)
    return ShardDebt(root, shard_of, monthly, urgent, not_due, partial, partial_version, served_before,
                     monthly_after_partial, urgent_after_partial, weekly, registry.by_alias(SCENARIO, "current"),
                     read_receipt(root, monthly.batch_id), kept_as_served,
                     flops[str(partial_version.version)] / flops["1"], sizes[1] / sum(sizes))


def test_both_batches_serve_on_the_interim_tier_each_owing_its_own_shard(shard_debt):
    for receipt in (shard_debt.monthly, shard_debt.urgent):
        assert receipt.forgetting == "interim" and receipt.exactly_forgotten is None
    assert shard_debt.urgent.exact_start_by < shard_debt.monthly.exact_start_by


def test_a_run_that_repays_only_what_is_due_does_nothing_before_a_latest_safe_start(shard_debt):
    assert shard_debt.not_due.status == 0, shard_debt.not_due.err
    assert "due yet" in shard_debt.not_due.out


def test_the_urgent_request_retrains_its_own_shard_and_keeps_the_other_as_it_served(shard_debt):
    version, before = shard_debt.partial_version, shard_debt.served_before
    assert shard_debt.partial.status == 0, shard_debt.partial.err
    assert version.version != before.version and version.tags["role"] == "repaid"
    assert version.tags["shards_retrained"] == "1" and version.tags["forgetting"] == "interim"
    assert version.tags["shard_origins"].split(",") == [f"kept:v{before.version}", "trained"]
    assert version.tags["shard_digests"].split(",")[0] == "-"  # never reused as a model trained from scratch
    assert shard_debt.kept_as_served


def test_the_urgent_shard_s_retrain_costs_its_share_of_a_full_training(shard_debt):
    # the original trained every shard on all the data; the repayment one shard on what it holds now
    assert 0 < shard_debt.flops_share <= shard_debt.shard_share + 1e-9 < 1


def test_the_urgent_receipt_is_forgotten_exactly_and_the_monthly_one_still_owes(shard_debt):
    urgent, monthly = shard_debt.urgent_after_partial, shard_debt.monthly_after_partial
    version = str(shard_debt.partial_version.version)
    assert urgent.exactly_forgotten is not None and urgent.exactly_forgotten.version == version
    assert urgent.shards_repaid == {"1": version}
    assert urgent.exact_shards.startswith(f"shard(s) 1 (v{version}) of 2 retrained from scratch")
    assert "never trained on these samples" in urgent.exact_shards
    assert urgent.exactly_forgotten.at <= urgent.exact_due
    assert monthly.exactly_forgotten is None and monthly.shards_repaid == {}


def test_the_weekly_run_retrains_the_shard_still_owed_and_reuses_the_one_retrained(shard_debt):
    version, partial = shard_debt.weekly_version, shard_debt.partial_version.version
    assert shard_debt.weekly.status == 0, shard_debt.weekly.err
    assert version.tags["role"] == "retrained" and version.tags["shards_retrained"] == "0"
    assert version.tags["shard_origins"].split(",") == ["trained", f"reused:v{partial}"]
    monthly = shard_debt.monthly_after_weekly
    assert monthly.exactly_forgotten is not None and monthly.exactly_forgotten.version == str(version.version)


def test_once_both_are_exact_every_version_that_learnt_them_retires_but_the_serving_one(shard_debt):
    registry = Registry(shard_debt.workspace)
    serving = shard_debt.weekly_version.version
    alive = [v.version for v in registry.versions(SCENARIO) if v.tags.get("retirement") != "retired"]
    assert alive == [serving], alive

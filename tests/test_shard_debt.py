"""Retrain debt per shard (fedunlearn/shard_debt.py): which shards a repayment retrains, both ways of
every branch, and the receipt's sentence as a batch's shards are repaid one repayment at a time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fedunlearn.shard_debt import ShardOwed, ShardRepayment, repaid_statement, shards_to_repay, touched_shards

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
PAST, LATER = NOW - timedelta(hours=1), NOW + timedelta(days=20)
SHARD_OF = (0, 1, 1, 0, 2)  # client -> shard, 3 shards


def test_a_batch_touches_the_shards_of_the_clients_whose_training_samples_it_forgot():
    assert touched_shards({"1": 3, "4": 1}, SHARD_OF) == {1, 2}
    assert touched_shards({"0": 0, "2": 5}, SHARD_OF) == {1}  # a client with nothing forgotten touches nothing
    assert touched_shards({}, SHARD_OF) == frozenset()


def test_an_urgent_batch_s_shard_is_retrained_and_the_others_that_owe_wait():
    owed = [ShardOwed("urgent", frozenset({1}), PAST), ShardOwed("monthly", frozenset({0, 2}), LATER)]
    plan = shards_to_repay(owed, only_due=True, now=NOW)
    assert plan == ShardRepayment(frozenset({1}), frozenset({0, 2})) and plan.partial


def test_a_due_batch_is_repaid_on_all_its_shards_even_where_another_batch_waits():
    owed = [ShardOwed("urgent", frozenset({0, 1}), PAST), ShardOwed("monthly", frozenset({1, 2}), LATER)]
    plan = shards_to_repay(owed, only_due=True, now=NOW)
    assert plan.retrain == {0, 1} and plan.wait == {2}


def test_when_every_owing_shard_is_due_the_repayment_is_not_partial():
    owed = [ShardOwed("a", frozenset({0}), PAST), ShardOwed("b", frozenset({2}), NOW)]  # NOW: its start has come
    plan = shards_to_repay(owed, only_due=True, now=NOW)
    assert plan.retrain == {0, 2} and not plan.wait and not plan.partial


def test_nothing_is_retrained_while_no_batch_is_due():
    plan = shards_to_repay([ShardOwed("monthly", frozenset({0, 2}), LATER)], only_due=True, now=NOW)
    assert not plan.retrain and plan.wait == {0, 2} and not plan.partial


def test_a_batch_without_a_recorded_start_counts_as_due():
    plan = shards_to_repay([ShardOwed("old", frozenset({2}), None), ShardOwed("m", frozenset({0}), LATER)],
                           only_due=True, now=NOW)
    assert plan.retrain == {2} and plan.wait == {0}


def test_every_shard_that_owes_unless_only_what_is_due_is_asked():
    owed = [ShardOwed("urgent", frozenset({1}), PAST), ShardOwed("monthly", frozenset({0}), LATER)]
    assert shards_to_repay(owed, only_due=False, now=NOW) is None  # the weekly run: one exact retrain


def test_a_due_batch_that_touched_no_shard_needs_the_whole_retrain():
    owed = [ShardOwed("held-out-only", frozenset(), PAST), ShardOwed("monthly", frozenset({0}), LATER)]
    assert shards_to_repay(owed, only_due=True, now=NOW) is None
    # ... but one that is not due yet does not force it
    owed = [ShardOwed("held-out-only", frozenset(), LATER), ShardOwed("urgent", frozenset({0}), PAST)]
    assert shards_to_repay(owed, only_due=True, now=NOW) == ShardRepayment(frozenset({0}))


def test_the_receipt_says_which_shards_are_retrained_which_still_owe_and_why_no_other_matters():
    partly = repaid_statement({"1": "7"}, frozenset({1, 2}), 3)
    assert partly.startswith("shard(s) 1 (v7) of 3 retrained from scratch without these samples")
    assert "shard(s) 2 still owe(s) their exact retrain" in partly and "never trained on these samples" in partly
    done = repaid_statement({"1": "7", "2": "9"}, frozenset({1, 2}), 3)
    assert "1 (v7), 2 (v9)" in done and "still owe" not in done
    every = repaid_statement({"0": "4", "1": "4"}, frozenset({0, 1}), 2)
    assert "never trained" not in every  # every shard held some: there is no other shard to speak of

"""Retrain debt per shard: which shards of a federation in shards an exact retrain must retrain now.

A batch forgotten on the interim tier owes an exact retrain of the shards that held its samples
(its *touched* shards), not of the federation: every other shard model never saw them (each shard
trains on its own clients only, ``fedunlearn.sharded_federation``). A shard retrained from scratch
after the batch no longer owes it; the batch is exactly forgotten once all its touched shards are.

So a repayment started because a latest safe start has come (a scheduled run, or a batch that finds
it passed) retrains only the shards *due*: those owed by a batch whose latest safe start has come.
Every other owing shard keeps the model serving (approximately unlearned) and waits for its own
latest safe start or the weekly repayment, which retrains every shard that owes. An urgent request
of one client retrains that client's shard, not the federation. Plain functions of plain values;
``tests/test_shard_debt.py`` checks every branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Sequence

from fedunlearn.certify.tiers import repay_now


@dataclass(frozen=True)
class ShardOwed:
    """One batch's retrain debt on a federation in shards: the shards that still hold its samples
    approximately (touched, not retrained from scratch since) and its latest safe start (None: not
    recorded, so due now)."""

    batch_id: str
    shards: frozenset[int]
    start_by: datetime | None


@dataclass(frozen=True)
class ShardRepayment:
    """What one repayment retrains from scratch (``retrain``) and which owing shards keep the model
    serving until a later repayment (``wait``)."""

    retrain: frozenset[int]
    wait: frozenset[int] = frozenset()

    @property
    def partial(self) -> bool:
        """Some owing shards wait: the version registered is exact on ``retrain`` only."""
        return bool(self.retrain) and bool(self.wait)


def touched_shards(forgotten_per_client: Mapping[str, int], shard_of: Sequence[int]) -> frozenset[int]:
    """The shards whose clients had training samples the batch forgot (a receipt's ``forgotten_per_client``)."""
    return frozenset(shard_of[int(client)] for client, count in forgotten_per_client.items() if count > 0)


def shards_to_repay(owed: Sequence[ShardOwed], only_due: bool, now: datetime) -> ShardRepayment | None:
    """The shards owed by a batch whose latest safe start has come (``only_due``), and the owing shards
    that wait; an empty ``retrain``: nothing is due yet. None: one exact retrain of every shard that
    owes — asked for (not ``only_due``), or a due batch touched no shard (its model came from a source
    that still owes), which cannot be repaid shard by shard."""
    if not only_due:
        return None
    due = [o for o in owed if o.start_by is None or repay_now(o.start_by, now)]
    if any(not o.shards for o in due):
        return None
    retrain = frozenset(k for o in due for k in o.shards)
    return ShardRepayment(retrain, frozenset(k for o in owed for k in o.shards) - retrain)


def repaid_statement(repaid: Mapping[str, str], touched: frozenset[int], count: int) -> str:
    """A receipt's ``exact_shards`` sentence as its touched shards are retrained one repayment at a
    time: which were retrained from scratch (by which version), which still owe, and why no other
    shard matters."""
    done = sorted(int(k) for k in repaid)
    left = sorted(touched - set(done))
    line = ("shard(s) " + ", ".join(f"{k} (v{repaid[str(k)]})" for k in done) + f" of {count} retrained from "
            "scratch without these samples")
    if left:
        line += f"; shard(s) {', '.join(map(str, left))} still owe(s) their exact retrain"
    return line + ("; the other shard(s) never trained on these samples (each shard model learns from its own "
                   "clients only)" if len(touched) < count else "")


__all__ = ["ShardOwed", "ShardRepayment", "repaid_statement", "shards_to_repay", "touched_shards"]

"""Retrain debt: requests forgotten only approximately (a certificate other than ``exact retrain``
or ``formal (ε,δ)``) are a stop-gap until an exact retrain on a data version without them serves.
The receipts are the ledger of the debt; repaying it marks them (``exactly_forgotten``)."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.receipts import ExactForgetting, Receipt, owes_retrain, read_receipts, write_receipt
from fedunlearn.requests.model import utc_now
from tasks.workspace import Workspace


@dataclass
class Debt:
    receipts: list[Receipt]

    @property
    def requests(self) -> int:
        return sum(len(r.request_ids) for r in self.receipts)

    @property
    def samples(self) -> int:
        return sum(r.deleted_samples for r in self.receipts)

    def line(self, threshold: int) -> str:
        if not self.receipts:
            return "retrain debt: none (every request so far forgotten exactly or with a formal guarantee)"
        return (f"retrain debt: {self.requests} request(s), {self.samples} sample(s) in {len(self.receipts)} batch(es) "
                f"forgotten only approximately since {self.receipts[0].created_at:%Y-%m-%d %H:%M}Z (an exact retrain "
                f"repays it: weekly, or past {threshold} requests)")


def retrain_debt(ws: Workspace, scenario: str) -> Debt:
    return Debt([r for r in read_receipts(ws.root, scenario) if owes_retrain(r)])


@task(name="repay-debt-receipts", cache_policy=NO_CACHE)
def mark_repaid(ws: Workspace, scenario: str, version: str, by: str) -> list[str]:
    """The receipts the exact retrain ``version`` (now ``current``) repays say so; returns their batches."""
    repaid = []
    for receipt in retrain_debt(ws, scenario).receipts:
        receipt.exactly_forgotten = ExactForgetting(at=utc_now(), version=version, by=by)
        write_receipt(ws.root, receipt)
        repaid.append(receipt.batch_id)
    return repaid

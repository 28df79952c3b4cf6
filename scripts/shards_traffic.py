"""The exact tier's FLOPs on a month of requests, unsharded against K shards (issue 48, item 5):
the requests ``scripts/month_of_traffic.py`` draws (same seed, same rules, same batch starts), each
batch forgotten by an exact retrain — of the whole federation (today's ``retrain`` policy), or of
the shards that held a deleted sample (a federation in shards). Nothing is trained: a retrain's
FLOPs are the cost records' formula (PUF Appendix B: F · E · R · retained samples, F the model's
training FLOPs per sample), so the figures are what the pipeline would record, not timings.

    .venv/bin/fedunlearn init /tmp/sh && .venv/bin/fedunlearn --root /tmp/sh prepare --scenario mnist5k-canary-hfl
    .venv/bin/python scripts/shards_traffic.py --root /tmp/sh --scenario mnist5k-canary-hfl --days 30 \
        --shards 1 2 4 5 10 --out /tmp/shards-traffic.json
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from month_of_traffic import batch_times, draw_arrivals, weekly_crons  # noqa: E402

from fedunlearn.config import load_params  # noqa: E402
from fedunlearn.data.store import load_horizontal  # noqa: E402
from fedunlearn.federation.cost import flops_per_sample, training_flops  # noqa: E402
from fedunlearn.sharded_federation import assign_shards  # noqa: E402
from models import build_model  # noqa: E402


def batches_of(root: Path, scenario: str, days: int, seed: int, traffic: tuple[float, int, float] = (10.0, 2, 0.03)
               ) -> tuple[list[list], dict[str, int], list[int]]:
    """The month's batches (each a list of arrivals), sample ID → client, and the clients' sizes."""
    params = load_params(root / "params.yaml")
    partition = load_horizontal(scenario, root)
    ids = {i: [str(s) for s in c.sample_ids] for i, c in enumerate(partition.clients)}
    arrivals = draw_arrivals(ids, days, *traffic, np.random.default_rng(seed))
    r = params.requests
    starts = batch_times(arrivals, r.batch_threshold, timedelta(hours=r.batch_window_hours),
                         timedelta(hours=r.urgent_hours), timedelta(hours=r.max_wait_hours))
    batches, taken = [], 0
    for at, _ in starts:
        due = [a for a in arrivals[taken:] if a.at <= at]
        taken += len(due)
        if due:
            batches.append((at, due))
    owner = {s: c for c, samples in ids.items() for s in samples}
    return batches, owner, [len(c.sample_ids) for c in partition.clients]


def exact_flops(batches: list[list], owner: dict[str, int], sizes: list[int], shard_of: tuple[int, ...],
                per_round: float) -> list[float]:
    """Per batch: the FLOPs of retraining, from scratch, the shards holding its deleted samples."""
    left = list(sizes)
    spent = []
    for _, batch in batches:
        touched = apply(batch, owner, left, shard_of)
        spent.append(sum(per_round * sum(n for c, n in enumerate(left) if shard_of[c] == s) for s in touched))
    return spent


def apply(batch: list, owner: dict[str, int], left: list[int], shard_of: tuple[int, ...]) -> set[int]:
    """``batch``'s deletions taken from ``left`` (samples per client); the shards they touch."""
    touched = set()
    for arrival in batch:
        if arrival.kind == "client":
            touched.add(shard_of[arrival.subject])
            left[arrival.subject] = 0
        else:
            for sample in arrival.subject:
                touched.add(shard_of[owner[sample]])
                left[owner[sample]] -= 1
    return touched


def interim_flops(batches: list, owner: dict[str, int], sizes: list[int], shard_of: tuple[int, ...],
                  per_round: float, lead: timedelta, debt_limit: int, per_shard: bool = True) -> tuple[float, int]:
    """The interim tier as the scheduler repays it: each batch owes the shards it touched, from its
    latest safe start (its earliest deadline less ``lead``); a repayment started then retrains the
    shards owed by the batches due (``per_shard``: ``fedunlearn.shard_debt``), or every shard that owes
    (not ``per_shard``: one debt); the weekly cron (Sundays 03:00) and a debt past ``debt_limit``
    requests (each counted once) retrain every shard that owes. Returns the exact retrains' FLOPs and
    the number of shard models retrained. K = 1 is the unsharded scheduler either way."""
    left, owed = list(sizes), []  # [start, shards still owed, requests] per batch
    crons, clock = weekly_crons(batches[-1][0] + timedelta(days=40)), batches[0][0]
    flops, retrains = 0.0, 0

    def repay(shards: set[int]) -> None:
        nonlocal flops, retrains, owed
        for shard in shards:
            flops += per_round * sum(n for c, n in enumerate(left) if shard_of[c] == shard)
            retrains += 1
        owed = [[start, touched - shards, n] for start, touched, n in owed if touched - shards]

    for at, batch in [*batches, (None, None)]:
        while owed:
            cron = next(c for c in crons if c > clock)
            when = max(min(min(o[0] for o in owed), cron), clock)
            if at is not None and when > at:
                break
            owing = set().union(*(o[1] for o in owed))
            repay(owing if when >= cron or not per_shard else set().union(*(o[1] for o in owed if o[0] <= when)))
            clock = when
        if batch is None:
            break
        clock = at
        touched = apply(batch, owner, left, shard_of)
        deadline = min(a.deadline or a.at + timedelta(days=30) for a in batch)
        if touched:
            owed.append([deadline - lead, touched, len(batch)])
        if sum(o[2] for o in owed) > debt_limit:
            repay(set().union(*(o[1] for o in owed)))
    return flops, retrains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--scenario", default="mnist5k-canary-hfl")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 5, 10])
    parser.add_argument("--per-day", type=float, default=10.0)
    parser.add_argument("--clients-per-month", type=int, default=2)
    parser.add_argument("--short-deadlines", type=float, default=0.03)
    parser.add_argument("--retrain-hours", type=float, default=1.0, help="a retrain's duration the safe start "
                        "allows for (× requests.exact_safety_factor, + requests.exact_margin_hours)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = load_params(args.root / "params.yaml")
    cfg = params.scenario(args.scenario)
    batches, owner, sizes = batches_of(args.root, args.scenario, args.days, args.seed,
                                       (args.per_day, args.clients_per_month, args.short_deadlines))
    shape = load_horizontal(args.scenario, args.root).input_shape
    per_sample = flops_per_sample(build_model(cfg.model, shape, 10, l2=cfg.l2), tuple(shape))
    per_round = training_flops(per_sample, 1, cfg.train.local_epochs) * cfg.train.rounds
    requests = sum(len(b) for _, b in batches)
    r = params.requests
    lead = timedelta(hours=r.exact_margin_hours + r.exact_safety_factor * args.retrain_hours)
    print(f"{args.scenario}, {args.days} days: {requests} requests in {len(batches)} batches")
    print("| K | exact retrain per batch: FLOPs per request | unsharded ÷ sharded | shards touched per batch (mean) "
          "| interim, debt per shard: FLOPs per request | shard retrains | retrain per batch (K = 1) ÷ this "
          "| interim, one debt: FLOPs per request | shard retrains |")
    rows: list[dict] = []
    for k in args.shards:
        shard_of = assign_shards(len(sizes), k, params.seed)
        spent = sum(exact_flops(batches, owner, sizes, shard_of, per_round))
        full = rows[0]["flops"] if rows and rows[0]["shards"] == 1 else spent if k == 1 else None
        touched = np.mean([len(apply(b, owner, list(sizes), shard_of)) for _, b in batches])
        interim, retrains = interim_flops(batches, owner, sizes, shard_of, per_round, lead, r.max_retrain_debt)
        whole, whole_retrains = interim_flops(batches, owner, sizes, shard_of, per_round, lead, r.max_retrain_debt,
                                              per_shard=False)
        rows.append({"shards": k, "flops": spent, "per_request": spent / requests,
                     "saving": full / spent if full and spent else None, "touched_mean": float(touched),
                     "interim_flops": interim, "interim_per_request": interim / requests, "shard_retrains": retrains,
                     "interim_saving": full / interim if full and interim else None,
                     "one_debt_per_request": whole / requests, "one_debt_shard_retrains": whole_retrains})
        print(f"| {k} | {rows[-1]['per_request']:.3g} | {rows[-1]['saving'] or float('nan'):.2f}× | {touched:.2f} "
              f"| {interim / requests:.3g} | {retrains} | {rows[-1]['interim_saving'] or float('nan'):.2f}× "
              f"| {whole / requests:.3g} | {whole_retrains} |")
    args.out.write_text(json.dumps({"scenario": args.scenario, "days": args.days, "seed": args.seed,
                                    "requests": requests, "batches": len(batches), "torch": torch.__version__,
                                    "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

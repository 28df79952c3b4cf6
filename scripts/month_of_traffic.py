"""A month of deletion traffic replayed under four policies, on the same requests: ``interim`` and
``strict`` (the forgetting policies), ``retrain`` (an exact retrain per batch, the honest baseline) and
``sharded`` (``interim`` on the federation in ``--shards`` shards: its exact retrains retrain only the
shards that held a deleted sample; fedunlearn/sharded_federation.py).

Arrivals over ``--days`` simulated days (about ``--per-day`` a day: mostly a few samples each, some
whole clients, a few with deadlines of two or three days) are drawn once from ``--seed``. Batches
start as the served deployment's triggers start them (``requests.batch_threshold`` requests within
``requests.batch_window_hours``, an urgent request due within ``requests.urgent_hours``, a request
waiting ``requests.max_wait_hours``; the daily cron as backstop); the exact retrain that repays
interim forgetting starts when Prefect would start it — at the latest safe time a batch recorded
(``exact_start_by``: ``repay-debt --only-due``, so a federation in shards retrains only the shards due),
or at the weekly cron (every shard that owes). Time is injected (``FEDUNLEARN_NOW``), so nothing
waits; every batch and retrain really runs (``fedunlearn process`` / ``repay-debt`` in this
process, each with a Prefect server of its own, a fresh workspace per policy trained from the same seed).

    .venv/bin/python scripts/month_of_traffic.py --scenario mnist5k-hfl --threads 1 --out /tmp/month-hfl
    .venv/bin/python scripts/month_of_traffic.py --scenario mnist5k-vfl --days 7 --threads 1 --out /tmp/month-vfl

Writes ``<out>.json`` (every request and event, every policy), ``<out>.md`` (the tables) and
``<out>.png`` (the timeline). Compute is the measured wall time of the batches and repayments
(training the original is the same for all and not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

START = datetime(2026, 1, 5, 0, 0, tzinfo=timezone.utc)  # a Monday


@dataclass
class Arrival:
    request_id: str
    at: datetime
    kind: str  # sample | client
    subject: list[str] | int
    deadline: datetime | None = None  # None: requests.deadline_days after `at`


@dataclass
class Event:
    at: datetime
    what: str  # batch | repay
    why: str
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    requests: list[str] = field(default_factory=list)
    note: str = ""


def draw_arrivals(ids_by_client: dict[int | None, list[str]], days: int, per_day: float, clients_per_month: int,
                  short_deadlines: float, rng: np.random.Generator) -> list[Arrival]:
    """The traffic, fixed before either policy runs: Poisson arrivals at uniform times, a few
    whole-client requests (never a client whose samples another request names), 1-5 samples
    otherwise, a share with a deadline of two or three days."""
    count = int(rng.poisson(per_day * days))
    times = sorted(START + timedelta(seconds=float(s)) for s in rng.uniform(0, days * 86400, count))
    clients = [c for c in ids_by_client if c is not None]
    whole = list(rng.choice(clients, size=min(clients_per_month * days // 30, max(len(clients) - 2, 0)),
                            replace=False)) if clients else []
    pool = [i for c, ids in ids_by_client.items() if c not in whole for i in ids]
    rng.shuffle(pool)
    client_slots = set(rng.choice(count, size=len(whole), replace=False).tolist()) if whole else set()
    arrivals = []
    for n, at in enumerate(times):
        deadline = at + timedelta(days=float(rng.choice([2, 3]))) if rng.random() < short_deadlines else None
        if n in client_slots:
            arrivals.append(Arrival(f"req-sim-{n:04d}", at, "client", int(whole.pop()), deadline))
        else:
            take = int(rng.integers(1, 6))
            arrivals.append(Arrival(f"req-sim-{n:04d}", at, "sample", [pool.pop() for _ in range(take)], deadline))
    return arrivals


def next_daily_cron(after: datetime) -> datetime:
    """process-deletions/deletion-batches' default cron, 02:00 UTC, strictly after ``after``."""
    cron = after.replace(hour=2, minute=0, second=0, microsecond=0)
    return cron if cron > after else cron + timedelta(days=1)


def batch_times(arrivals: list[Arrival], threshold: int, window: timedelta, urgent: timedelta,
                max_wait: timedelta) -> list[tuple[datetime, str]]:
    """When the deployment's triggers (``flows.serve.batch_triggers``) and its daily cron start a
    batch; each batch takes every request pending then."""
    starts, pending = [], []
    for arrival in arrivals:
        while pending:
            waited, cron = pending[0].at + max_wait, next_daily_cron(pending[0].at)
            due = min(waited, cron)
            if due >= arrival.at:
                break
            starts.append((due, "daily cron" if due == cron else "waited too long"))
            pending.clear()
        pending.append(arrival)
        if arrival.deadline and arrival.deadline - arrival.at <= urgent:
            starts.append((arrival.at, "urgent request"))
            pending.clear()
        elif sum(a.at > arrival.at - window for a in pending) >= threshold:
            starts.append((arrival.at, f"{threshold} requests within the window"))
            pending.clear()
    if pending:
        starts.append((min(pending[0].at + max_wait, next_daily_cron(pending[0].at)), "daily cron"))
    return starts


def weekly_crons(end: datetime) -> list[datetime]:
    """repay-retrain-debt/weekly: Sundays 03:00 UTC (flows.serve.DEBT_CRON)."""
    return [START + timedelta(days=6 + 7 * w, hours=3) for w in range((end - START).days // 7 + 1)
            if START + timedelta(days=6 + 7 * w, hours=3) <= end]


@dataclass
class Took:
    status: int
    seconds: float  # wall
    cpu_seconds: float  # this process's CPU time: what the work cost, less what other processes took
    out: str


def cli(root: Path, at: datetime, *args: str) -> Took:
    """``fedunlearn`` in this process at the simulated time ``at``."""
    from cli import main

    os.environ["FEDUNLEARN_NOW"] = at.isoformat()
    out = io.StringIO()
    started, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out):
        status = main(["--root", str(root), *args])
    return Took(status, time.perf_counter() - started, time.process_time() - cpu, out.getvalue())


def submit(root: Path, scenario: str, arrivals: list[Arrival]) -> None:
    """The arrivals into the inbox as the users sent them (their own submission times and deadlines)."""
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import submit_request
    from fedunlearn.requests.model import build_request

    folders = RequestFolders.create(root)
    for a in arrivals:
        subject = {"sample_ids": a.subject} if a.kind == "sample" else {"client": a.subject}
        fields = {"request_id": a.request_id, "kind": a.kind, "scenario": scenario, "submitted_at": a.at.isoformat(),
                  **subject, **({"deadline": a.deadline.isoformat()} if a.deadline else {})}
        submit_request(folders, build_request(fields))


def owed_start(root: Path, scenario: str) -> datetime | None:
    """The earliest latest-safe-time of the receipts still owing an exact retrain (what Prefect holds
    as scheduled runs of repay-retrain-debt)."""
    from fedunlearn.receipts import owes_retrain, read_receipts

    owed = [r.exact_start_by for r in read_receipts(root, scenario) if owes_retrain(r) and r.exact_start_by]
    return min(owed, default=None)


# What `fedunlearn process` runs under each policy: ``retrain`` is the honest baseline, an exact retrain
# per batch and nothing else (no approximate attempt to discard first).
POLICY_ARGS = {"interim": ("--forgetting-policy", "interim"), "strict": ("--forgetting-policy", "strict"),
               "retrain": ("--method", "retrain"), "sharded": ("--forgetting-policy", "interim")}


class Replay:
    """One policy's workspace stepped through the simulated month; the policies step in lockstep,
    so a loaded machine slows them alike."""

    def __init__(self, policy: str, scenario: str, root: Path, end: datetime, shards: int = 1):
        from stores.workspace import init_workspace

        self.policy, self.scenario, self.root = policy, scenario, init_workspace(root)
        if policy == "sharded":
            set_shards(self.root, scenario, shards)
        self.events: list[Event] = []
        self.clock, self.submitted = START, 0
        self.crons = weekly_crons(end + timedelta(days=31))
        took = cli(self.root, START - timedelta(hours=1), "train", "--scenario", scenario)
        assert took.status == 0, f"training {scenario} failed ({took.status})"

    def repayments_before(self, until: datetime) -> None:
        """The repayments Prefect would start before ``until``: a scheduled run at a batch's latest
        safe time, the weekly cron while anything is owed."""
        while True:
            start = owed_start(self.root, self.scenario)
            cron = next((c for c in self.crons if self.clock < c < until), None)
            due = min([t for t in (start, cron) if t is not None and t < until], default=None)
            if due is None:
                return
            scheduled = due == start
            due = max(due, self.clock)
            took = cli(self.root, due, "repay-debt", "--scenario", self.scenario, *(["--only-due"] if scheduled else []))
            self.events.append(Event(due, "repay", "latest safe time" if scheduled else "weekly cron",
                                     took.seconds, took.cpu_seconds, note=f"exit {took.status}; {took.out.strip()}"))
            self.clock = due + timedelta(seconds=took.seconds)
            if scheduled and owed_start(self.root, self.scenario) == start:  # Prefect would not run it again
                raise RuntimeError(f"{self.policy}: the repayment at its latest safe start {start} left it owed: "
                                   f"{took.out.strip()}")

    def batch(self, at: datetime, why: str, arrivals: list[Arrival]) -> None:
        self.repayments_before(at)
        due = [a for a in arrivals[self.submitted:] if a.at <= at]
        os.environ["FEDUNLEARN_NOW"] = at.isoformat()  # the requests arrive before the batch starts
        submit(self.root, self.scenario, due)
        self.submitted += len(due)
        at = max(at, self.clock)
        took = cli(self.root, at, "process", "--scenario", self.scenario, *POLICY_ARGS[self.policy])
        told = [line for line in took.out.splitlines() if line.startswith(("attempts:", "forgetting:"))]
        self.events.append(Event(at, "batch", why, took.seconds, took.cpu_seconds, [a.request_id for a in due],
                                 "; ".join([f"exit {took.status}", *told])))
        self.clock = at + timedelta(seconds=took.seconds)

    def result(self, arrivals: list[Arrival], end: datetime) -> dict:
        from fedunlearn.receipts import read_receipts
        from stores.registry import Registry

        self.repayments_before(end + timedelta(days=31))
        receipts = read_receipts(self.root, self.scenario)
        return {"policy": self.policy, "events": [asdict(e) for e in self.events],
                "requests": request_outcomes(arrivals, receipts),
                **exact_training(Registry(self.root), self.scenario),
                **served_accuracy(Registry(self.root), self.scenario),
                **retirement_counts(self.root, self.scenario),
                "compute_seconds": sum(e.seconds for e in self.events),
                "cpu_seconds": sum(e.cpu_seconds for e in self.events)}


def exact_training(registry, scenario: str) -> dict:
    """The exact retrains (full, or of the shards due: role ``repaid``) and the shard models they
    trained from scratch (a federation in shards; K per retrain that trained every shard)."""
    versions = [v for role in ("retrained", "repaid") for v in registry.versions(scenario, role=role)]
    shards = sum(len([s for s in v.tags["shards_retrained"].split(",") if s.isdigit()]) if "shards_retrained" in v.tags
                 else 1 for v in versions)  # one federation: one model per retrain
    return {"exact_retrains": len(versions), "shard_retrains": shards,
            "partial_retrains": sum(v.tags.get("role") == "repaid" for v in versions)}


def served_accuracy(registry, scenario: str) -> dict:
    """The registered test accuracy of the original (version 1) and of the version serving at the end
    (alias ``current``): a sharded version's is the served ensemble's."""
    def test_acc(version) -> float | None:
        return None if version is None else registry.metrics(version.run_id).get("test_acc")

    serving = registry.by_alias(scenario, "current")
    return {"test_acc_original": test_acc(registry.version(scenario, "1")), "test_acc_serving": test_acc(serving),
            "serving_version": None if serving is None else str(serving.version)}


def retirement_counts(root: Path, scenario: str) -> dict:
    """The versions retired at the end, those still pending (they learnt a request not yet exactly
    forgotten), and those missed: every request they learnt is exactly forgotten, no hold keeps them,
    they do not serve — and they still have their weights (issue 46: there must be none)."""
    from stores.registry import retired_batch
    from stores.workspace import Workspace
    from tasks.retirement import retirement_plan

    ws = Workspace.open(root)
    plan = retirement_plan(ws, scenario)
    return {"retired_versions": sum(bool(retired_batch(v)) for v in ws.registry.versions(scenario)),
            "pending_retirement": len(plan.pending), "retirement_missed": sorted(plan.retire, key=int)}


def request_outcomes(arrivals: list[Arrival], receipts: list) -> list[dict]:
    """Per request: hours to interim and to exact forgetting, its deadline, whether exact forgetting met it."""
    by_request = {rid: r for r in receipts for rid in r.request_ids}
    rows = []
    for a in arrivals:
        receipt = by_request.get(a.request_id)
        if receipt is None:
            rows.append({"request_id": a.request_id, "kind": a.kind, "submitted": a.at.isoformat(), "forgotten": False})
            continue
        exact_at = (receipt.exactly_forgotten.at if receipt.exactly_forgotten
                    else receipt.created_at if receipt.forgetting in ("exact", "formal") else None)
        deadline = receipt.deadlines.get(a.request_id)
        rows.append({"request_id": a.request_id, "kind": a.kind, "submitted": a.at.isoformat(), "forgotten": True,
                     "tier": receipt.forgetting, "batch": receipt.batch_id,
                     "hours_to_interim": (receipt.created_at - a.at).total_seconds() / 3600,
                     "hours_to_exact": (exact_at - a.at).total_seconds() / 3600 if exact_at else None,
                     "deadline": deadline.isoformat() if deadline else None, "short_deadline": a.deadline is not None,
                     "deadline_met": bool(exact_at and deadline and exact_at <= deadline)})
    return rows


def summary(run: dict) -> dict:
    rows = run["requests"]
    interim = [r["hours_to_interim"] for r in rows if r["forgotten"]]
    exact = [r["hours_to_exact"] for r in rows if r["forgotten"] and r["hours_to_exact"] is not None]
    batches = [e for e in run["events"] if e["what"] == "batch"]
    return {"policy": run["policy"], "requests": len(rows), "batches": len(batches),
            "exact_retrains": run["exact_retrains"], "compute_seconds": run["compute_seconds"],
            "shard_retrains": run.get("shard_retrains", 0), "partial_retrains": run.get("partial_retrains", 0),
            "retired_versions": run["retired_versions"], "pending_retirement": run["pending_retirement"],
            "retirement_missed": len(run["retirement_missed"]),
            "cpu_seconds": run["cpu_seconds"],
            "median_hours_to_interim": float(np.median(interim)) if interim else None,
            "median_hours_to_exact": float(np.median(exact)) if exact else None,
            "max_hours_to_exact": max(exact, default=None),
            "deadlines_missed": sum(not r.get("deadline_met") for r in rows),
            "test_acc_original": run.get("test_acc_original"), "test_acc_serving": run.get("test_acc_serving"),
            "short_deadlines": sum(bool(r.get("short_deadline")) for r in rows)}


def markdown(scenario: str, summaries: list[dict], command: str) -> str:
    head = ("| policy | requests | batches | exact retrains (of the shards due; shard models) | compute: wall (s) | CPU (s) "
            "| median h to interim | median h to exact | max h to exact | deadlines missed (short ones) "
            "| versions retired (pending, missed) | test acc: original, serving at the end |"
            "\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = [f"| {s['policy']} | {s['requests']} | {s['batches']} | {s['exact_retrains']} ({s['partial_retrains']}; "
            f"{s['shard_retrains']}) | {s['compute_seconds']:.0f} "
            f"| {s['cpu_seconds']:.0f} "
            f"| {_h(s['median_hours_to_interim'])} | {_h(s['median_hours_to_exact'])} | {_h(s['max_hours_to_exact'])} "
            f"| {s['deadlines_missed']} ({s['short_deadlines']} with 2-3 days) "
            f"| {s['retired_versions']} ({s['pending_retirement']}, {s['retirement_missed']}) "
            f"| {_acc(s.get('test_acc_original'))}, {_acc(s.get('test_acc_serving'))} |" for s in summaries]
    by = {s["policy"]: s for s in summaries}
    ratio = "".join(f"\n\n{other} / interim compute: {by[other]['compute_seconds'] / by['interim']['compute_seconds']:.1f}x "
                    f"wall, {by[other]['cpu_seconds'] / by['interim']['cpu_seconds']:.1f}x CPU"
                    for other in ("strict", "retrain") if {other, "interim"} <= set(by) and by["interim"]["cpu_seconds"])
    if "retrain" in by and "interim" in by and by["interim"]["exact_retrains"]:
        ratio += (f"\n\nbound on the saving once retraining dominates: batches / exact retrains under interim = "
                  f"{by['retrain']['batches']} / {by['interim']['exact_retrains']} = "
                  f"{by['retrain']['batches'] / by['interim']['exact_retrains']:.1f}x")
    if {"retrain", "sharded"} <= set(by) and by["sharded"]["cpu_seconds"]:
        ratio += (f"\n\nretrain / sharded compute: {by['retrain']['compute_seconds'] / by['sharded']['compute_seconds']:.1f}x "
                  f"wall, {by['retrain']['cpu_seconds'] / by['sharded']['cpu_seconds']:.1f}x CPU")
    return f"{scenario}: `{command}`\n\n" + "\n".join([head, *rows]) + ratio + "\n"


def _acc(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _h(hours: float | None) -> str:
    return "–" if hours is None else f"{hours:.1f}"


def plot(runs: list[dict], arrivals: list[Arrival], path: Path, days: int) -> None:
    """Requests (ticks; short deadlines as crosses at the deadline), batches and exact retrains per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 2.2 + 0.8 * len(runs)))
    day = lambda t: (datetime.fromisoformat(t) if isinstance(t, str) else t).timestamp() / 86400 - START.timestamp() / 86400
    ax.scatter([day(a.at) for a in arrivals], [0] * len(arrivals), marker="|", s=60, color="0.4", label="request")
    short = [a for a in arrivals if a.deadline]
    ax.scatter([day(a.deadline) for a in short], [0] * len(short), marker="x", color="red", label="short deadline")
    for row, run in enumerate(runs, start=1):
        for kind, marker, color in (("batch", "o", "tab:blue"), ("repay", "s", "tab:orange")):
            times = [day(e["at"]) for e in run["events"] if e["what"] == kind
                     and (kind == "batch" or "repaid" in e["note"])]  # a weekly run with nothing owed did nothing
            ax.scatter(times, [row] * len(times), marker=marker, color=color, s=24,
                       label=("batch" if kind == "batch" else "exact retrain (repay)") if row == 1 else None)
        retrained = [day(e["at"]) for e in run["events"] if e["what"] == "batch"
                     and ("retrain (exact retrain" in e["note"] or "repaid in this run" in e["note"])]
        ax.scatter(retrained, [row] * len(retrained), marker="s", color="tab:orange", s=24)
    ax.set_yticks(range(len(runs) + 1), ["requests", *(r["policy"] for r in runs)])
    ax.set_xlim(-0.5, days + 3)
    ax.set_xlabel("simulated day")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def set_shards(root: Path, scenario: str, shards: int) -> None:
    """The workspace's ``scenario`` in ``shards`` shards (its params.yaml rewritten)."""
    import yaml

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["scenarios"][scenario]["shards"] = shards
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="mnist5k-hfl")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=float, default=10.0)
    parser.add_argument("--clients-per-month", type=int, default=2, help="whole-client requests per 30 days (HFL/DFL)")
    parser.add_argument("--short-deadlines", type=float, default=0.03, help="share of requests due in 2-3 days")
    parser.add_argument("--policies", nargs="+", default=["interim", "strict", "retrain"], choices=sorted(POLICY_ARGS),
                        help="interim and strict (params' forgetting_policy), retrain (an exact retrain per batch: "
                        "`process --method retrain`)")
    parser.add_argument("--shards", type=int, default=5, help="K of the sharded policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (1 on a shared machine)")
    parser.add_argument("--work", type=Path, help="where the workspaces go (default: a temporary directory)")
    parser.add_argument("--out", type=Path, required=True, help="<out>.json, <out>.md, <out>.png")
    args = parser.parse_args()
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    results = replay(args)
    command = "python scripts/month_of_traffic.py " + " ".join(sys.argv[1:])
    summaries = [summary(r) for r in results["runs"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    arrivals = results.pop("arrivals_objects")
    args.out.with_suffix(".json").write_text(json.dumps({**results, "summaries": summaries}, indent=1, default=str))
    args.out.with_suffix(".md").write_text(markdown(args.scenario, summaries, command))
    plot(results["runs"], arrivals, args.out.with_suffix(".png"), args.days)
    print(args.out.with_suffix(".md").read_text())
    missed = {r["policy"]: r["retirement_missed"] for r in results["runs"] if r["retirement_missed"]}
    for policy, versions in missed.items():  # a version that outlived the forgetting of all it learnt
        print(f"error: under {policy}, {args.scenario} v{', v'.join(versions)} learnt only exactly forgotten "
              "requests and still has its weights", file=sys.stderr)
    return 1 if missed else 0


def replay(args: argparse.Namespace) -> dict:
    import tempfile

    from cli.data import sample_ids
    from fedunlearn.config import load_params
    from fedunlearn.data.store import read_manifest
    from stores.workspace import init_workspace

    work = Path(args.work or tempfile.mkdtemp(prefix="month-"))
    probe = init_workspace(work / "probe")
    cli(probe, START, "prepare", "--scenario", args.scenario)
    manifest = read_manifest(args.scenario, probe)
    ids = ({None: sample_ids(probe, args.scenario)} if manifest["setting"] == "vfl" else
           {c["client"]: sample_ids(probe, args.scenario, c["client"]) for c in manifest["clients"]})
    arrivals = draw_arrivals(ids, args.days, args.per_day, args.clients_per_month if None not in ids else 0,
                             args.short_deadlines, np.random.default_rng(args.seed))
    requests = load_params(probe / "params.yaml").requests
    starts = batch_times(arrivals, requests.batch_threshold, timedelta(hours=requests.batch_window_hours),
                         timedelta(hours=requests.urgent_hours), timedelta(hours=requests.max_wait_hours))
    end = START + timedelta(days=args.days)
    replays = [Replay(policy, args.scenario, work / policy, end, args.shards) for policy in args.policies]
    for at, why in starts:
        for replay_ in replays:
            replay_.batch(at, why, arrivals)
    runs = [replay_.result(arrivals, end) for replay_ in replays]
    return {"scenario": args.scenario, "days": args.days, "seed": args.seed, "arrivals": [asdict(a) for a in arrivals],
            "batch_starts": [(t.isoformat(), why) for t, why in starts], "runs": runs, "arrivals_objects": arrivals}


if __name__ == "__main__":
    sys.exit(main())

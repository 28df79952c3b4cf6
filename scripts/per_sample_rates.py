"""The interim tier's decision at every request size, with the per-sample evidence: how often a
no-op, an exact retrain and an over-forgetter serve, over draws of 1 to 40 deleted samples, on
memorisation nobody declared (docs/BENCHMARKS.md, "The interim decision at every request size").

Each *world* partitions and trains everything again with its own global seed (held-out split,
clients, original model, the audit's references, the shadow model), so worlds are independent. In a
world, a pool U is drawn: candidates for remembered samples — training samples the source predicts
with their training label and the references' majority does not (with ``--truth planted`` or
``canaries``, only rows of the benchmark's ground-truth list) — and as many other training samples.
One exact retrain without U is trained, and one over-forgetter (that retrain trained on for more
epochs while a hinge pushes each U sample's labelled logit below its best other class,
``audit_power.over_forgetting``). The remembered pool keeps the candidates the retrain does not
predict either: the source predicts them, models that never saw them do not. Each draw takes n
samples of one kind; the three candidates — the source itself (no-op), the retrain and the
over-forgetter — are judged as a batch judges an attempt without a retrained reference
(``certify.gates.judge``, the per-sample check included) and the interim tier's decision is counted.
No decision reads the ground truth: it only says which samples are drawn.

    .venv/bin/fedunlearn init /tmp/umem
    .venv/bin/python scripts/user_csv_scenarios.py --root /tmp/umem --kind mislabel
    .venv/bin/fedunlearn --root /tmp/umem prepare --scenario user-mislabel-hfl
    .venv/bin/python scripts/per_sample_rates.py --root /tmp/umem --scenario user-mislabel-hfl --truth planted \
        --planted /tmp/umem/user/mislabel.planted.json --worlds 20 --first-world 200 --draws 4 \
        --sizes 1,2,4,8,16,40 --threads 1 --out /tmp/per_sample_rates

Writes ``<out>.json`` (every draw) and ``<out>.md`` (the table, Clopper–Pearson 95 % intervals).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit_power import build_setup, fmt_rate, over_forgetting, seeded_partition  # noqa: E402

from fedunlearn.certify.certificate import EMPIRICAL_ONLY  # noqa: E402
from fedunlearn.certify.gates import PromotionGates, judge  # noqa: E402
from fedunlearn.config import load_params  # noqa: E402
from fedunlearn.device import resolve_device  # noqa: E402
from fedunlearn.evaluation.audit import audit_forgetting  # noqa: E402
from fedunlearn.evaluation.evaluator import Evaluator, evaluation_sets  # noqa: E402
from fedunlearn.evaluation.per_sample import REMEMBERED  # noqa: E402
from fedunlearn.federation.forget_set import ForgetSet  # noqa: E402
from fedunlearn.training import train  # noqa: E402

KINDS = ("remembered", "ordinary")
CANDIDATES = (("noop", "no-op (the source model)"), ("retrain", "exact retrain (as if approximate)"),
              ("over", "over-forgetter"))


@torch.no_grad()
def ground_truth(setup, restrict: set[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """Candidates for the samples the source remembers — it predicts their training label, and the
    majority of the audit's references (models that never saw them) does not — and the other
    training samples; with ``restrict`` (planted or canary IDs), the candidates among those only.
    The benchmark's ground truth (``run_world`` keeps the candidates the world's exact retrain does
    not predict either): no decision reads it."""
    from fedunlearn.federation.local import predict_logits

    source = setup.federation.model_from(setup.original.state)
    remembered, typical = [], []
    for client in setup.federation.clients:
        if not len(client):
            continue
        label = client.y.cpu()
        votes = torch.stack([predict_logits(m, client.x).softmax(1).cpu() for m in setup.references.models]).mean(0)
        hit, seen_hit = predict_logits(source, client.x).argmax(1).cpu() == label, votes.argmax(1) == label
        ids = client.sample_ids
        chosen = (hit & ~seen_hit).numpy()
        if restrict is not None:
            chosen &= np.array([_named(i, restrict) for i in ids])
        remembered.append(ids[chosen])
        typical.append(ids[~chosen])
    return np.concatenate(remembered), np.concatenate(typical)


def _named(sample_id: str, names: set[str]) -> bool:
    """Whether a dataset's sample ID is one of ``names``: equal, or the user's ID behind the dataset's name."""
    return sample_id in names or sample_id.split("-", 2)[-1] in names or sample_id.split("-", 1)[-1] in names


def world_pool(setup, size: int, seed: int, restrict: set[str] | None) -> dict[str, np.ndarray]:
    """U: ``size`` candidates for remembered samples (all, if fewer) and ``size`` other ones, seeded."""
    rng = np.random.default_rng([seed, 0x505])
    remembered, typical = ground_truth(setup, restrict)
    return {"remembered": rng.choice(remembered, size=min(size, len(remembered)), replace=False),
            "ordinary": rng.choice(typical, size=min(size, len(typical)), replace=False)}


def judged(candidate_model, setup, batch, evaluator, sets, source_eval, audit_source, gates) -> dict[str, Any]:
    """One candidate judged as a batch judges an attempt without a retrained reference."""
    evaluation = evaluator.evaluate(candidate_model)
    audit = audit_forgetting(candidate_model, sets.forget, setup.references, seed=setup.params.seed)
    per_sample = audit.per_sample_check(audit_source)
    gate = judge(evaluation, EMPIRICAL_ONLY, source=source_eval, reference=None, gates=gates,
                 audit=audit.as_check(), source_audit=audit_source.as_check(),
                 audit_equivalence=audit.equivalence_check(), atypical=audit.atypical, per_sample=per_sample)
    return {"interim": gate.interim, "held_back": gate.held_back, "per_sample": per_sample.verdict,
            "equivalence": audit.equivalence_check().verdict, "auc": audit.auc,
            "remembered": len(audit.shown(REMEMBERED)), "forget_acc": evaluation.forget_acc}


def run_draw(setup, models: dict[str, Any], kind: str, chosen: np.ndarray, gates: PromotionGates) -> dict[str, Any]:
    federation = setup.federation
    batch = ForgetSet.for_sample_ids(chosen, federation.clients)
    sets = evaluation_sets(federation, batch)
    evaluator = Evaluator(federation, batch, sets=sets, shadow_model=setup.shadow)
    source_eval = evaluator.evaluate(models["noop"])
    audit_source = audit_forgetting(models["noop"], sets.forget, setup.references, seed=setup.params.seed)
    record = {"kind": kind, "n": len(chosen), "source_remembers": len(audit_source.shown(REMEMBERED))}
    for key, _ in CANDIDATES:
        record[key] = judged(models[key], setup, batch, evaluator, sets, source_eval, audit_source, gates)
    return record


def run_world(args: argparse.Namespace, params, root: Path, world: int, scratch: Path, device,
              gates: PromotionGates) -> list[dict[str, Any]]:
    setup = build_setup(args, seeded_partition(args, params, root, world, scratch), scratch, device)
    federation, sizes = setup.federation, [int(s) for s in args.sizes.split(",")]
    pool = world_pool(setup, max(sizes) + args.spare, world, restriction(args, setup))
    everything = ForgetSet.for_sample_ids(np.concatenate(list(pool.values())), federation.clients)
    t = time.perf_counter()
    retrained = train(dataclasses.replace(federation, clients=federation.retained_clients(everything), state={}))
    over = over_forgetting(federation, retrained.state, everything, args.over_forget_epochs, world)
    pool["remembered"] = missed_by(federation.model_from(retrained.state), federation, pool["remembered"])
    models = {"noop": federation.model_from(setup.original.state), "retrain": federation.model_from(retrained.state),
              "over": over}
    print(f"world {world}: retrain and over-forgetter {time.perf_counter() - t:.1f} s", flush=True)
    rng, draws = np.random.default_rng([world, 0xD4A]), []
    for kind in KINDS:
        for n in sizes:
            for d in range(args.draws):
                chosen = rng.choice(pool[kind], size=min(n, len(pool[kind])), replace=False)
                draws.append({"world": world, "draw": d, **run_draw(setup, models, kind, chosen, gates)})
    return draws


@torch.no_grad()
def missed_by(model, federation, sample_ids: np.ndarray) -> np.ndarray:
    """The samples among ``sample_ids`` whose training label ``model`` does not predict."""
    from fedunlearn.federation.local import predict_logits

    if not len(sample_ids):
        return sample_ids
    data = federation.forget_data(ForgetSet.for_sample_ids(sample_ids, federation.clients))
    missed = (predict_logits(model, data.x).argmax(1).cpu() != data.y.cpu()).numpy()
    return data.sample_ids[missed]


def restriction(args: argparse.Namespace, setup) -> set[str] | None:
    """The rows ground truth may name: ``--planted`` (a file of IDs), the partition's canaries, or any."""
    if args.truth == "canaries":
        return set(setup.canaries)
    if args.truth == "planted":
        return set(json.loads(Path(args.planted).read_text()))
    return None


def table(draws: list[dict[str, Any]], sizes: list[int]) -> str:
    lines = ["| forget samples | kind | draws | audit shows the source remembers | no-op serves (remembered draws) | "
             "exact retrain serves | over-forgetter serves | retrain held back by (count) |",
             "|---|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        for n in sizes:
            rows = [d for d in draws if d["kind"] == kind and d["n"] == n]
            if not rows:
                continue
            # Remembered draws are remembered by ground truth; ordinary ones only where the audit says so.
            shows = rows if kind == "remembered" else [d for d in rows if d["source_remembers"]]
            served = {key: sum(bool(d[key]["interim"]) for d in rows) for key, _ in CANDIDATES}
            noop = sum(bool(d["noop"]["interim"]) for d in shows)
            why = Counter(line.split(":")[0] for d in rows for line in d["retrain"]["held_back"])
            audit_shows = sum(bool(d["source_remembers"]) for d in rows)
            lines.append(f"| {n} | {kind} | {len(rows)} | {audit_shows}/{len(rows)} | "
                         f"{fmt_rate(noop, len(shows)) if shows else '–'} | {fmt_rate(served['retrain'], len(rows))} | "
                         f"{fmt_rate(served['over'], len(rows))} | "
                         f"{', '.join(f'{c} ({k})' for c, k in why.most_common()) or '–'} |")
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a workspace with the scenario's data prepared")
    parser.add_argument("--scenario", default="digits-canary-hfl")
    parser.add_argument("--worlds", type=int, default=20, help="independent worlds (partition + training each)")
    parser.add_argument("--first-world", type=int, default=100, help="the first world's global seed")
    parser.add_argument("--draws", type=int, default=4, help="draws per world, kind and size")
    parser.add_argument("--sizes", default="1,2,4,8,16,40", help="forget-set sizes")
    parser.add_argument("--truth", choices=("any", "planted", "canaries"), default="any",
                        help="which remembered samples are drawn: any the source remembers (its own predictions "
                        "against the references'), only --planted rows, or only the partition's canaries")
    parser.add_argument("--planted", help="a JSON list of the planted rows' IDs (scripts/user_csv_scenarios.py)")
    parser.add_argument("--spare", type=int, default=20, help="U holds the largest size plus this many per kind")
    parser.add_argument("--over-forget-epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=None, help="override the scenario's training rounds")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="/tmp/per_sample_rates")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    started, root, out, gates = time.perf_counter(), Path(args.root), Path(args.out), PromotionGates()
    params, device = load_params(root / "params.yaml"), resolve_device("cpu")
    meta = {"scenario": args.scenario, "command": " ".join(sys.argv), "audit_config": params.audit.model_dump(),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads", "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()}
    draws: list[dict[str, Any]] = []
    for world in range(args.first_world, args.first_world + args.worlds):
        with tempfile.TemporaryDirectory(prefix="per-sample-") as scratch:
            draws += run_world(args, params, root, world, Path(scratch), device, gates)
        meta["seconds"] = time.perf_counter() - started
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "draws": draws}, indent=1, default=float))
    meta["load_average_at_end"] = os.getloadavg()
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "draws": draws}, indent=1, default=float))
    text = table(draws, [int(s) for s in args.sizes.split(",")])
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""The per-example audit's power and false alarms, and the gates' false-reject rate on exact
retrains (issue 17, item 7; DESIGN.md §4-§6).

Trains the original model once and the audit's reference models once, then for each batch kind
(N random training samples across the clients, or one whole client) and each seed: draws a
forget set, trains an exact retrain without it, audits the original and the retrain
(``audit_forgetting``) and runs the promotion gates (``certify.gates.judge``) on the retrain as if
an approximate method had produced it (certificate ``empirical only``, so it is not exempt as an
exact retrain), without a retrained reference (the policy then compares with the source model),
the audit's check included — what ``flows/process.py`` would decide. With ``--reference-retrain``
the gates also judge it against a second exact retrain with another seed (the "vs retrained
reference" policy).

    .venv/bin/fedunlearn init /tmp/ap && .venv/bin/fedunlearn --root /tmp/ap prepare --scenario mnist5k-hfl
    .venv/bin/python scripts/audit_power.py --root /tmp/ap --threads 1 --out /tmp/audit_power

(``--threads 1`` on a shared 2-core machine: two intra-op threads under load slowed training >5×.)

Writes ``<out>.json`` (every draw) and ``<out>.md`` (the tables, Clopper-Pearson 95% intervals).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import beta

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.certify.gates import PromotionGates, judge
from fedunlearn.config import load_params
from fedunlearn.device import resolve_device
from fedunlearn.evaluation.audit import (
    AuditResult,
    ReferenceSet,
    audit_forgetting,
    matched_nonmember_rows,
    train_references,
)
from fedunlearn.evaluation.evaluator import (
    Evaluator,
    evaluation_sets,
    train_shadow_model,
)
from fedunlearn.evaluation.mia import logit_scaled_confidence
from fedunlearn.federation.batch import DeletionBatch
from fedunlearn.training import load_federation, train

CLIENT = "client"


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion k/n."""
    if n == 0:
        return (float("nan"), float("nan"))
    a = 1 - confidence
    low = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return (low, high)


def draw_batch(kind: str, seed: int, clients: list, client_order: np.ndarray) -> DeletionBatch:
    """``kind``: a number of samples drawn uniformly from all clients' training samples, or
    ``client`` (the seed-th client of a seeded order: a different client per seed)."""
    if kind == CLIENT:
        return DeletionBatch.for_clients([int(client_order[seed % len(client_order)])], clients)
    ids = np.concatenate([c.sample_ids for c in clients])
    chosen = np.random.default_rng([seed, int(kind), 0xA0D17]).choice(ids, size=int(kind), replace=False)
    return DeletionBatch.for_sample_ids(chosen, clients)


def auc(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """Mann-Whitney AUC, ties counted half."""
    greater = (members[:, None] > nonmembers[None, :]).sum()
    ties = (members[:, None] == nonmembers[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(members) * len(nonmembers)))


def label_diagnostics(target, forget, references: ReferenceSet, seed: int) -> dict[str, float]:
    """A check on the audit's label matching, outside the audit: the total variation distance
    between the forget set's label mix and the matched non-members' (0 when pool B holds enough
    samples of every label), and the label-stratified AUC — per label, the forget samples' score
    against all pool-B samples of that label, averaged with the forget set's label weights. The
    score is the difference-calibrated φ_target − μ_out, which orders samples like the audit's z
    (pooled σ), so with a perfect label match the two AUCs estimate the same quantity."""
    forget_y, pool_y = forget.y.cpu().numpy(), references.pool.y.cpu().numpy()
    rows = matched_nonmember_rows(forget_y, pool_y, seed)
    share = lambda labels: np.bincount(labels, minlength=int(max(forget_y.max(), pool_y.max())) + 1) / len(labels)
    forget_phi = np.stack([logit_scaled_confidence(m, forget) for m in references.models]).mean(axis=0)
    forget_score = logit_scaled_confidence(target, forget) - forget_phi
    pool_score = logit_scaled_confidence(target, references.pool) - references.pool_phi.mean(axis=0)
    stratified = sum((forget_y == label).sum() * auc(forget_score[forget_y == label], pool_score[pool_y == label])
                     for label in np.unique(forget_y)) / len(forget_y)
    return {"label_tv_distance": float(0.5 * np.abs(share(forget_y) - share(pool_y[rows])).sum()),
            "stratified_auc": float(stratified)}


def audit_record(result: AuditResult, diagnostics: dict[str, float]) -> dict[str, Any]:
    return {"verdict": result.verdict, "auc": result.auc, "interval": list(result.interval),
            "n_forget": result.n_forget, "n_nonmembers": result.n_nonmembers, "seconds": result.seconds,
            **diagnostics}


def gate_record(outcome) -> dict[str, Any]:
    return {"verdict": outcome.verdict, "policy": outcome.policy,
            "checks": {c.name: {"verdict": c.verdict, "value": c.value, "interval": c.interval, "limit": c.limit}
                       for c in outcome.checks}}


def evaluation_record(evaluation) -> dict[str, float]:
    return {key: getattr(evaluation, key) for key in ("test_acc", "retain_acc", "forget_acc", "mia_auc")}


def fmt_rate(k: int, n: int) -> str:
    low, high = clopper_pearson(k, n)
    return f"{k}/{n} [{low:.2f}, {high:.2f}]"


def mean_of(rows: list[dict[str, Any]], key: str, field: str) -> str:
    values = [d[key][field] for d in rows if field in d[key]]
    return f"{np.mean(values):.3f}" if values else "–"


def max_of(rows: list[dict[str, Any]], key: str, field: str) -> str:
    values = [d[key][field] for d in rows if field in d[key]]
    return f"{np.max(values):.2f}" if values else "–"


def tables(draws: list[dict[str, Any]], kinds: list[str], with_reference: bool) -> str:
    def label(kind: str) -> str:
        return "one client" if kind == CLIENT else f"{kind} samples"

    groups = [(label(kind), [d for d in draws if d["kind"] == kind]) for kind in kinds]
    groups = [(name, rows) for name, rows in groups if rows]
    groups.append(("all kinds", draws))
    lines = [("Audit (offline LiRA, K references, α = 0.05, tolerance 0.05): verdicts over the draws, "
              "Clopper–Pearson 95% intervals."), "",
             ("| batch | forget samples | original: `not forgotten` (power) | original: inconclusive | "
              "retrain: `forgotten` | retrain: inconclusive | retrain: `not forgotten` (false alarm) | "
              "AUC original (mean) | AUC retrain (mean) | label-stratified AUC original / retrain (mean) | "
              "label-mix TV distance (max) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in groups:
        n = len(rows)
        sizes = [d["n_forget"] for d in rows]
        size = f"{sizes[0]}" if min(sizes) == max(sizes) else f"{min(sizes)}–{max(sizes)}"
        orig = Counter(d["audit_original"]["verdict"] for d in rows)
        ret = Counter(d["audit_retrain"]["verdict"] for d in rows)
        lines.append(f"| {name} | {size} | {fmt_rate(orig['not forgotten'], n)} | {orig['inconclusive']}/{n} | "
                     f"{fmt_rate(ret['forgotten'], n)} | {ret['inconclusive']}/{n} | "
                     f"{fmt_rate(ret['not forgotten'], n)} | "
                     f"{np.mean([d['audit_original']['auc'] for d in rows]):.3f} | "
                     f"{np.mean([d['audit_retrain']['auc'] for d in rows]):.3f} | "
                     f"{mean_of(rows, 'audit_original', 'stratified_auc')} / "
                     f"{mean_of(rows, 'audit_retrain', 'stratified_auc')} | "
                     f"{max_of(rows, 'audit_retrain', 'label_tv_distance')} |")
    policies = [("gates_retrain", "without reference (vs source model), audit included")]
    if with_reference:
        policies.append(("gates_retrain_vs_reference", "vs a second retrain (other seed), audit included"))
    policies.append(("gates_original", "the original model as the candidate (without reference)"))
    for key, title in policies:
        lines += ["", f"Gates, {title}; candidate certificate `empirical only`:", "",
                  "| batch | fail | inconclusive | pass | checks that failed (count) | checks inconclusive (count) |",
                  "|---|---|---|---|---|---|"]
        for name, rows in groups:
            rows = [d for d in rows if key in d]
            if not rows:
                continue
            n = len(rows)
            verdicts = Counter(d[key]["verdict"] for d in rows)
            failed = Counter(c for d in rows for c, v in d[key]["checks"].items() if v["verdict"] == "fail")
            unsure = Counter(c for d in rows for c, v in d[key]["checks"].items() if v["verdict"] == "inconclusive")
            lines.append(f"| {name} | {fmt_rate(verdicts['fail'], n)} | {fmt_rate(verdicts['inconclusive'], n)} | "
                         f"{fmt_rate(verdicts['pass'], n)} | "
                         f"{', '.join(f'{c} ({k})' for c, k in failed.most_common()) or '–'} | "
                         f"{', '.join(f'{c} ({k})' for c, k in unsure.most_common()) or '–'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/ap", help="a workspace with the scenario's data prepared")
    parser.add_argument("--scenario", default="mnist5k-hfl")
    parser.add_argument("--kinds", default="8,40,200,client", help="comma-separated sample counts and/or 'client'")
    parser.add_argument("--seeds", type=int, default=5, help="draws per batch kind (≥ 5)")
    parser.add_argument("--rounds", type=int, default=None, help="override the scenario's training rounds "
                        "(original and retrains alike)")
    parser.add_argument("--reference-retrain", action="store_true",
                        help="also judge each retrain against a second retrain with another seed (2× the retrains)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", default="/tmp/audit_power", help="writes <out>.json and <out>.md")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    root = Path(args.root)
    params = load_params(root / "params.yaml")
    device = resolve_device(args.device)
    federation = load_federation(args.scenario, params, root, device)
    if federation.setting == "vfl":
        sys.exit("the script rebuilds the clients' data sets: HFL/DFL scenarios only")
    if args.rounds is not None:
        federation = dataclasses.replace(federation, train_config=federation.train_config.model_copy(
            update={"rounds": args.rounds}))
    timings: dict[str, Any] = {}

    t = time.perf_counter()
    original = train(federation)
    timings["original_seconds"] = time.perf_counter() - t
    original_model = federation.model_from(original.state)
    print(f"original: {timings['original_seconds']:.1f} s", flush=True)

    references = train_references(federation.test,
                                  lambda: federation.model_from(federation.engine().initial_state()),
                                  config=params.audit, seed=params.seed)
    timings["references"] = {"K": len(references), "seconds": references.seconds, "epochs": params.audit.epochs}
    print(f"references: K={len(references)} in {references.seconds:.1f} s", flush=True)

    t = time.perf_counter()
    any_batch = DeletionBatch.for_clients([0], federation.clients)
    shadow = train_shadow_model(federation, evaluation_sets(federation, any_batch).shadow_in)
    timings["shadow_seconds"] = time.perf_counter() - t

    gates = PromotionGates()
    client_order = np.random.default_rng([params.seed, 0xC11E]).permutation(
        [i for i, c in enumerate(federation.clients) if len(c)])
    draws: list[dict[str, Any]] = []
    out = Path(args.out)
    meta = {"scenario": args.scenario, "kinds": kinds, "seeds": args.seeds, "rounds": federation.train_config.rounds,
            "audit_config": params.audit.model_dump(), "gates": gates.model_dump(mode="json"),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, device {device}",
            "command": " ".join(sys.argv), "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    for kind in kinds:
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            batch = draw_batch(kind, seed, federation.clients, client_order)
            sets = evaluation_sets(federation, batch)
            evaluator = Evaluator(federation, batch, sets=sets, shadow_model=shadow)
            source_eval = evaluator.evaluate(original_model)
            t = time.perf_counter()
            retrained = train(dataclasses.replace(federation, clients=federation.retained_clients(batch), state={}))
            retrain_seconds = time.perf_counter() - t
            retrain_model = federation.model_from(retrained.state)
            retrain_eval = evaluator.evaluate(retrain_model)
            audit_original = audit_forgetting(original_model, sets.forget, references, seed=params.seed)
            audit_retrain = audit_forgetting(retrain_model, sets.forget, references, seed=params.seed)
            record = {"kind": kind, "seed": seed, "n_forget": batch.num_forget,
                      "clients": batch.clients or sorted(batch.forget_ids), "retrain_seconds": retrain_seconds,
                      "eval_original": evaluation_record(source_eval), "eval_retrain": evaluation_record(retrain_eval),
                      "audit_original": audit_record(audit_original, label_diagnostics(original_model, sets.forget,
                                                                                       references, params.seed)),
                      "audit_retrain": audit_record(audit_retrain, label_diagnostics(retrain_model, sets.forget,
                                                                                     references, params.seed)),
                      "gates_retrain": gate_record(judge(retrain_eval, EMPIRICAL_ONLY, source=source_eval,
                                                         reference=None, gates=gates,
                                                         audit=audit_retrain.as_check())),
                      "gates_original": gate_record(judge(source_eval, EMPIRICAL_ONLY, source=source_eval,
                                                          reference=None, gates=gates,
                                                          audit=audit_original.as_check()))}
            if args.reference_retrain:
                other = train(dataclasses.replace(federation, clients=federation.retained_clients(batch), state={},
                                                  seed=params.seed + 1000 + seed))
                reference_eval = evaluator.evaluate(federation.model_from(other.state))
                record["gates_retrain_vs_reference"] = gate_record(
                    judge(retrain_eval, EMPIRICAL_ONLY, source=source_eval, reference=reference_eval, gates=gates,
                          audit=audit_retrain.as_check()))
            record["seconds"] = time.perf_counter() - t0
            draws.append(record)
            print(f"{kind:>6} seed {seed}: n={batch.num_forget:4d}  audit original {audit_original.verdict:13s} "
                  f"(AUC {audit_original.auc:.3f})  retrain {audit_retrain.verdict:13s} (AUC {audit_retrain.auc:.3f})"
                  f"  gates(retrain) {record['gates_retrain']['verdict']:12s}"
                  + (f" vs-ref {record['gates_retrain_vs_reference']['verdict']:12s}" if args.reference_retrain
                     else "") + f"  retrain {retrain_seconds:.1f} s, draw {record['seconds']:.1f} s", flush=True)
            timings["total_seconds"] = time.perf_counter() - started
            out.with_suffix(".json").write_text(json.dumps({"meta": meta, "timings": timings, "draws": draws},
                                                           indent=1, default=float))
    timings["total_seconds"] = time.perf_counter() - started
    timings["load_average_at_end"] = os.getloadavg()
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "timings": timings, "draws": draws}, indent=1,
                                                   default=float))
    text = tables(draws, kinds, args.reference_retrain)
    text += (f"\nOriginal training {timings['original_seconds']:.0f} s; references K = {len(references)} "
             f"({params.audit.epochs} epochs) {references.seconds:.1f} s; retrain mean "
             f"{np.mean([d['retrain_seconds'] for d in draws]):.1f} s; total {timings['total_seconds']:.0f} s.\n")
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

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

(``--threads 1`` on a shared 2-core machine: why, docs/methods.md, "Measuring the audit".)

A scenario with mislabelled canaries (``partition.canary_fraction``, e.g. ``digits-canary-hfl``)
takes batch kinds ``canaries<N>``: N of its canaries (the manifest's IDs), a seeded draw per seed;
the audit then compares them with pool B relabelled by the canaries' rule. ``--weak-epochs E``
also judges a too-weak unlearning, emulated: the source model fine-tuned for E epochs on the
retained data only (central SGD at the scenario's learning rate and batch size, no ascent on the
forget set), audited and gated like a candidate.

    .venv/bin/fedunlearn init /tmp/apc && .venv/bin/fedunlearn --root /tmp/apc prepare --scenario digits-canary-hfl
    .venv/bin/python scripts/audit_power.py --root /tmp/apc --scenario digits-canary-hfl --kinds canaries40 \
        --seeds 80 --seed-per-draw --weak-epochs 1 --threads 1 --out /tmp/audit_power_canaries

``--seed-per-draw`` partitions and trains everything again per draw with the draw's seed as the
global seed, so that the draws — and the Clopper–Pearson intervals over them — are independent.

Writes ``<out>.json`` (every draw) and ``<out>.md`` (the tables, Clopper-Pearson 95% intervals).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import beta

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.certify.gates import PromotionGates, judge
from fedunlearn.config import load_params
from fedunlearn.device import resolve_device
from fedunlearn.data.store import RAW_DIR, canary_ids, partition_scenario, read_manifest
from fedunlearn.evaluation.audit import (
    AuditResult,
    AuditSet,
    audit_forgetting,
    matched_nonmember_rows,
    train_audit_set,
)
from fedunlearn.evaluation.evaluator import (
    Evaluator,
    evaluation_sets,
    train_shadow_model,
)
from fedunlearn.evaluation.mia import logit_scaled_confidence
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.local import Tensors, sgd_epochs
from fedunlearn.training import load_federation, train

CLIENT = "client"
CANARIES = "canaries"


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion k/n."""
    if n == 0:
        return (float("nan"), float("nan"))
    a = 1 - confidence
    low = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return (low, high)


def draw_batch(kind: str, seed: int, clients: list, client_order: np.ndarray,
               canaries: list[str] | None = None) -> ForgetSet:
    """``kind``: a number of samples drawn uniformly from all clients' training samples,
    ``client`` (the seed-th client of a seeded order: a different client per seed) or
    ``canaries<N>`` (N drawn uniformly from the partition's ``canaries``)."""
    if kind == CLIENT:
        return ForgetSet.for_clients([int(client_order[seed % len(client_order)])], clients)
    if kind.startswith(CANARIES):
        chosen = np.random.default_rng([seed, 0xCA4A]).choice(canaries, size=int(kind[len(CANARIES):]), replace=False)
        return ForgetSet.for_sample_ids(chosen, clients)
    ids = np.concatenate([c.sample_ids for c in clients])
    chosen = np.random.default_rng([seed, int(kind), 0xA0D17]).choice(ids, size=int(kind), replace=False)
    return ForgetSet.for_sample_ids(chosen, clients)


def auc(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """Mann-Whitney AUC, ties counted half."""
    greater = (members[:, None] > nonmembers[None, :]).sum()
    ties = (members[:, None] == nonmembers[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(members) * len(nonmembers)))


def label_diagnostics(target, forget, references: AuditSet, seed: int) -> dict[str, float]:
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


def canary_setup(params, scenario: str, root: Path) -> list[str]:
    """The scenario's canary IDs ([] without canaries): the benchmark's ground truth, which no
    decision reads."""
    if params.scenario(scenario).partition.canary_fraction <= 0:
        return []
    return canary_ids(read_manifest(scenario, root))


def weak_unlearning(federation, state: dict, forget_set: ForgetSet, epochs: int, seed: int):
    """A too-weak method: the source model fine-tuned for ``epochs`` epochs on the retained data only,
    centrally (SGD at the scenario's lr, momentum and batch size): it keeps most of what it memorised."""
    model = federation.model_from(state)
    retained = federation.retained_clients(forget_set)
    data = Tensors(torch.cat([c.x for c in retained]), torch.cat([c.y for c in retained]),
                   np.concatenate([c.sample_ids for c in retained]))
    config = federation.train_config
    sgd_epochs(model, data, epochs=epochs, lr=config.lr, batch_size=config.batch_size, momentum=config.momentum,
               generator=torch.Generator().manual_seed(seed))
    return model


def over_forgetting(federation, state: dict, forget_set: ForgetSet, epochs: int, seed: int, margin: float = 30.0):
    """An over-forgetting stand-in: the exact retrain trained ``epochs`` more epochs on the retained
    data (the scenario's SGD) while every step also pushes each forget sample's labelled-class
    logit ``margin`` below its best other class (a hinge that does not fade as the probability
    falls), so that the forget set scores well *below* never-seen samples while utility holds —
    what an over-eager method shows."""
    model = federation.model_from(state)
    forget, config = federation.forget_data(forget_set), federation.train_config
    retained = federation.retained_clients(forget_set)
    x, y = torch.cat([c.x for c in retained]), torch.cat([c.y for c in retained])
    optimiser = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for rows in torch.randperm(len(y), generator=generator).split(config.batch_size):
            logits = model(forget.x)
            labelled = logits.gather(1, forget.y[:, None])[:, 0]
            best_other = logits.scatter(1, forget.y[:, None], float("-inf")).max(dim=1).values
            push = torch.nn.functional.softplus(labelled - best_other + margin).mean()
            optimiser.zero_grad()
            (torch.nn.functional.cross_entropy(model(x[rows]), y[rows]) + push).backward()
            optimiser.step()
    model.eval()
    return model


def audit_record(result: AuditResult, diagnostics: dict[str, float]) -> dict[str, Any]:
    equivalence = result.equivalence_check()
    return {"verdict": result.verdict, "auc": result.auc, "interval": list(result.interval),
            "n_forget": result.n_forget, "n_nonmembers": result.n_nonmembers, "seconds": result.seconds,
            "margin": result.margin, "equivalence": equivalence.verdict if equivalence else None, **diagnostics}


def gate_record(outcome) -> dict[str, Any]:
    return {"verdict": outcome.verdict, "policy": outcome.policy, "interim": outcome.interim,
            "held_back": outcome.held_back,
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
        if kind.startswith(CANARIES):
            return f"{kind[len(CANARIES):]} canaries"
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
    if any("gates_weak" in d for d in draws):
        lines += weak_table(groups)
        policies.append(("gates_weak", "a too-weak method (fine-tuned on retained data only) as the candidate "
                                       "(without reference)"))
    lines += interim_table(groups)
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


def weak_table(groups: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """The audit's verdicts on the too-weak method (``--weak-epochs``)."""
    lines = ["", "Audit of a too-weak method (the source model fine-tuned on retained data only):", "",
             "| batch | weak: `not forgotten` (detection) | weak: inconclusive | weak: `forgotten` | AUC weak (mean) | "
             "forget accuracy original / weak / retrain (mean) |", "|---|---|---|---|---|---|"]
    for name, rows in groups:
        rows = [d for d in rows if "audit_weak" in d]
        if not rows:
            continue
        n, weak = len(rows), Counter(d["audit_weak"]["verdict"] for d in rows)
        accuracy = " / ".join(f"{np.mean([d[key]['forget_acc'] for d in rows]):.3f}"
                              for key in ("eval_original", "eval_weak", "eval_retrain"))
        lines.append(f"| {name} | {fmt_rate(weak['not forgotten'], n)} | {weak['inconclusive']}/{n} | "
                     f"{fmt_rate(weak['forgotten'], n)} | {np.mean([d['audit_weak']['auc'] for d in rows]):.3f} | "
                     f"{accuracy} |")
    return lines


CANDIDATES = (("original", "no-op (the source model)"), ("weak", "too-weak method"),
              ("over", "over-forgetting stand-in"), ("retrain", "exact retrain (as if approximate)"))


def interim_table(groups: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """How often each candidate may serve on the interim tier, and the audit read as equivalence."""
    lines = ["", "Interim tier (without a retrained reference, audit read as equivalence within its margin):", "",
             "| batch | candidate | serves on the interim tier | audit equivalent / inconclusive / shown apart | "
             "AUC mean (range) | margin (mean) | why held back (count) |", "|---|---|---|---|---|---|---|"]
    for name, rows in groups:
        for key, title in CANDIDATES:
            rows_k = [d for d in rows if f"gates_{key}" in d and d[f"gates_{key}"].get("interim") is not None]
            if not rows_k:
                continue
            n, audits = len(rows_k), [d[f"audit_{key}"] for d in rows_k]
            served = sum(bool(d[f"gates_{key}"]["interim"]) for d in rows_k)
            seen = Counter(a["equivalence"] for a in audits)
            why = Counter(line.split(":")[0].split(" (")[0] for d in rows_k for line in d[f"gates_{key}"]["held_back"])
            aucs = [a["auc"] for a in audits]
            lines.append(f"| {name} | {title} | {fmt_rate(served, n)} | {seen['pass']} / {seen['inconclusive']} / "
                         f"{seen['fail']} | {np.mean(aucs):.3f} ({min(aucs):.3f}–{max(aucs):.3f}) | "
                         f"{np.mean([a['margin'] for a in audits]):.3f} | "
                         f"{', '.join(f'{c} ({k})' for c, k in why.most_common()) or '–'} |")
    return lines


@dataclass
class Setup:
    """What every draw of one data version shares: the original, the references, the shadow model."""

    params: Any
    federation: Any
    original: Any
    references: AuditSet
    shadow: Any
    canaries: list[str]
    client_order: np.ndarray
    timings: dict[str, Any]


def build_setup(args: argparse.Namespace, params, root: Path, device) -> Setup:
    """Train the original, the audit's references and the shadow model on ``root``'s partition."""
    federation = load_federation(args.scenario, params, root, device)
    if federation.setting == "vfl":
        sys.exit("the script rebuilds the clients' data sets: HFL/DFL scenarios only")
    if args.rounds is not None:
        federation = dataclasses.replace(federation, train_config=federation.train_config.model_copy(
            update={"rounds": args.rounds}))
    t = time.perf_counter()
    original = train(federation)
    timings: dict[str, Any] = {"original_seconds": time.perf_counter() - t}
    references = train_audit_set(federation.test,
                                  lambda: federation.model_from(federation.engine().initial_state()),
                                  config=params.audit, seed=params.seed)
    canaries = canary_setup(params, args.scenario, root)
    timings["references"] = {"K": len(references), "seconds": references.seconds, "epochs": params.audit.epochs}
    t = time.perf_counter()
    any_batch = ForgetSet.for_clients([0], federation.clients)
    shadow = train_shadow_model(federation, evaluation_sets(federation, any_batch).shadow_in)
    timings["shadow_seconds"] = time.perf_counter() - t
    client_order = np.random.default_rng([params.seed, 0xC11E]).permutation(
        [i for i, c in enumerate(federation.clients) if len(c)])
    print(f"seed {params.seed}: original {timings['original_seconds']:.1f} s, references K={len(references)} in "
          f"{references.seconds:.1f} s", flush=True)
    return Setup(params, federation, original, references, shadow, canaries, client_order, timings)


def seeded_partition(args: argparse.Namespace, params, root: Path, seed: int, scratch: Path):
    """The scenario partitioned again with global seed ``seed`` (held-out split, clients, canaries,
    pools: all redrawn) into ``scratch``, from ``root``'s prepared data."""
    params = params.model_copy(update={"seed": seed})
    if not (scratch / RAW_DIR).exists():
        (scratch / RAW_DIR).parent.mkdir(parents=True, exist_ok=True)
        (scratch / RAW_DIR).symlink_to((root / RAW_DIR).resolve())
    partition_scenario(args.scenario, params, scratch)
    return params


def run_draw(setup: Setup, kind: str, seed: int, args: argparse.Namespace, gates: PromotionGates) -> dict[str, Any]:
    """One draw: a forget set, its exact retrain, the audits and the gates of the original, the
    retrain and (``--weak-epochs``) a too-weak method."""
    federation, references, params = setup.federation, setup.references, setup.params
    original_model = federation.model_from(setup.original.state)
    t0 = time.perf_counter()
    batch = draw_batch(kind, seed, federation.clients, setup.client_order, setup.canaries)
    sets = evaluation_sets(federation, batch)
    evaluator = Evaluator(federation, batch, sets=sets, shadow_model=setup.shadow)
    source_eval = evaluator.evaluate(original_model)
    t = time.perf_counter()
    retrained = train(dataclasses.replace(federation, clients=federation.retained_clients(batch), state={}))
    retrain_seconds = time.perf_counter() - t
    retrain_model = federation.model_from(retrained.state)
    retrain_eval = evaluator.evaluate(retrain_model)
    audit_original = audit_forgetting(original_model, sets.forget, references, seed=params.seed)
    audit_retrain = audit_forgetting(retrain_model, sets.forget, references, seed=params.seed)
    # Matched-subset diagnostics compare with correctly labelled pool-B rows: meaningless for canaries.
    diagnose = (lambda model: {}) if kind.startswith(CANARIES) else (
        lambda model: label_diagnostics(model, sets.forget, references, params.seed))

    def gated(evaluation, audit: AuditResult, reference=None) -> dict[str, Any]:
        return gate_record(judge(evaluation, EMPIRICAL_ONLY, source=source_eval, reference=reference, gates=gates,
                                 audit=audit.as_check(), source_audit=audit_original.as_check(),
                                 audit_equivalence=audit.equivalence_check(), atypical=audit.atypical))

    record = {"kind": kind, "seed": seed, "partition_seed": params.seed, "n_forget": batch.num_forget,
              "clients": batch.clients or sorted(batch.forget_ids), "retrain_seconds": retrain_seconds,
              "eval_original": evaluation_record(source_eval), "eval_retrain": evaluation_record(retrain_eval),
              "audit_original": audit_record(audit_original, diagnose(original_model)),
              "audit_retrain": audit_record(audit_retrain, diagnose(retrain_model)),
              "gates_retrain": gated(retrain_eval, audit_retrain), "gates_original": gated(source_eval, audit_original)}
    if args.weak_epochs:
        weak = weak_unlearning(federation, setup.original.state, batch, args.weak_epochs, seed)
        weak_eval = evaluator.evaluate(weak)
        audit_weak = audit_forgetting(weak, sets.forget, references, seed=params.seed)
        record.update(eval_weak=evaluation_record(weak_eval), audit_weak=audit_record(audit_weak, {}),
                      gates_weak=gated(weak_eval, audit_weak))
    if args.over_forget_epochs:
        over = over_forgetting(federation, retrained.state, batch, args.over_forget_epochs, seed)
        over_eval = evaluator.evaluate(over)
        audit_over = audit_forgetting(over, sets.forget, references, seed=params.seed)
        record.update(eval_over=evaluation_record(over_eval), audit_over=audit_record(audit_over, {}),
                      gates_over=gated(over_eval, audit_over))
    if args.reference_retrain:
        other = train(dataclasses.replace(federation, clients=federation.retained_clients(batch), state={},
                                          seed=params.seed + 1000 + seed))
        record["gates_retrain_vs_reference"] = gated(retrain_eval, audit_retrain,
                                                     evaluator.evaluate(federation.model_from(other.state)))
    record["seconds"] = time.perf_counter() - t0
    print(f"{kind:>6} seed {seed}: n={batch.num_forget:4d}  audit original {audit_original.verdict:13s} "
          f"(AUC {audit_original.auc:.3f})  retrain {audit_retrain.verdict:13s} (AUC {audit_retrain.auc:.3f})"
          f"  gates(retrain) {record['gates_retrain']['verdict']:12s}"
          + (f"  weak {record['audit_weak']['verdict']} (AUC {record['audit_weak']['auc']:.3f})" if args.weak_epochs
             else "") + f"  retrain {retrain_seconds:.1f} s, draw {record['seconds']:.1f} s", flush=True)
    return record


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/ap", help="a workspace with the scenario's data prepared")
    parser.add_argument("--scenario", default="mnist5k-hfl")
    parser.add_argument("--kinds", default="8,40,200,client",
                        help="comma-separated sample counts, 'client' and/or 'canaries<N>'")
    parser.add_argument("--seeds", type=int, default=5, help="draws per batch kind (≥ 5)")
    parser.add_argument("--seed-per-draw", action="store_true",
                        help="partition and train everything again for every draw with global seed = the draw's "
                        "seed (independent draws: held-out split, canaries, original, references all redrawn)")
    parser.add_argument("--rounds", type=int, default=None, help="override the scenario's training rounds "
                        "(original and retrains alike)")
    parser.add_argument("--reference-retrain", action="store_true",
                        help="also judge each retrain against a second retrain with another seed (2× the retrains)")
    parser.add_argument("--weak-epochs", type=int, default=0, help="also judge a too-weak method: the source model "
                        "fine-tuned this many epochs on the retained data only (0: not)")
    parser.add_argument("--over-forget-epochs", type=int, default=0, help="also judge an over-forgetting "
                        "stand-in: the exact retrain trained this many more epochs on the retained data while "
                        "pushing the forget samples' labelled-class logits below the others (0: not)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--out", default="/tmp/audit_power", help="writes <out>.json and <out>.md")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    kinds = [k.strip() for k in args.kinds.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    root, out, gates = Path(args.root), Path(args.out), PromotionGates()
    params, device = load_params(root / "params.yaml"), resolve_device(args.device)
    setup = None if args.seed_per_draw else build_setup(args, params, root, device)
    meta = {"scenario": args.scenario, "kinds": kinds, "seeds": args.seeds, "seed_per_draw": args.seed_per_draw,
            "rounds": args.rounds or params.scenario(args.scenario).train.rounds,
            "audit_config": params.audit.model_dump(), "gates": gates.model_dump(mode="json"),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, device {device}",
            "command": " ".join(sys.argv), "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    draws: list[dict[str, Any]] = []
    setups: list[dict[str, Any]] = [] if setup is None else [setup.timings]
    with tempfile.TemporaryDirectory(prefix="audit-power-") as scratch:
        for kind in kinds:
            for seed in range(args.seeds):
                if args.seed_per_draw:
                    setup = build_setup(args, seeded_partition(args, params, root, seed, Path(scratch)),
                                        Path(scratch), device)
                    setups.append(setup.timings)
                draws.append(run_draw(setup, kind, seed, args, gates))
                timings = {"setups": setups, "total_seconds": time.perf_counter() - started}
                out.with_suffix(".json").write_text(json.dumps({"meta": meta, "timings": timings, "draws": draws},
                                                               indent=1, default=float))
    timings["load_average_at_end"] = os.getloadavg()
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "timings": timings, "draws": draws}, indent=1,
                                                   default=float))
    text = tables(draws, kinds, args.reference_retrain)
    text += (f"\nOriginal training {np.mean([t['original_seconds'] for t in setups]):.0f} s (mean of {len(setups)}); "
             f"references K = {params.audit.num_references} ({params.audit.epochs} epochs) "
             f"{np.mean([t['references']['seconds'] for t in setups]):.1f} s; retrain mean "
             f"{np.mean([d['retrain_seconds'] for d in draws]):.1f} s; total {timings['total_seconds']:.0f} s.\n")
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

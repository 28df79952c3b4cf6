"""The cost–forgetting frontier on a memorising scenario (issue 34, item 4): for each registered HFL
method at each strength, over draws of a canary batch — compute against the exact retrain of the
same draw (FLOPs and seconds), the audit's AUC, how often the interim tier serves the version, and
its test accuracy against the retrain's.

The original model, the audit's references and the shadow model are trained once on the
workspace's partition (``scripts/audit_power.py``'s ``build_setup``); each draw takes ``canaries<N>``
with its own seed, retrains exactly without them (the registered ``retrain`` method, so its cost is
counted like every method's), and applies every (method, options) of the grid to the original —
PUF told to stop recovery at the source's test accuracy, as a deletion batch tells it.
Draws share the original and the references: they vary the forget set, not the training run.

    .venv/bin/fedunlearn init /tmp/fr && .venv/bin/fedunlearn --root /tmp/fr prepare --scenario mnist5k-canary-hfl
    .venv/bin/python scripts/frontier.py --root /tmp/fr --scenario mnist5k-canary-hfl --draws 20 --threads 1 \
        --out /tmp/frontier

``--first-draw`` and ``--draws`` split the draws over processes (each trains the same original from the
same seed); ``--merge A.json B.json …`` joins their outputs, and for a seed that several share adds
the earlier outputs' runs of settings the later lacks (``merged_draws``). Writes ``<out>.json`` (every run),
``<out>.md`` (the table) and ``<out>.png`` (cost ratio against AUC, one line per method).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit_power import build_setup, clopper_pearson, draw_batch  # noqa: E402

from fedunlearn.certify.certificate import EMPIRICAL_ONLY  # noqa: E402
from fedunlearn.certify.gates import PromotionGates, judge  # noqa: E402
from fedunlearn.config import load_params  # noqa: E402
from fedunlearn.device import resolve_device  # noqa: E402
from fedunlearn.evaluation.audit import audit_forgetting  # noqa: E402
from fedunlearn.evaluation.evaluator import Evaluator, correctness, evaluation_sets  # noqa: E402
from fedunlearn.federation.forget_set import ForgetSet  # noqa: E402
from fedunlearn.unlearning.escalation import Attempt, batch_order, default_method, default_escalation  # noqa: E402
from fedunlearn.unlearning.registry import available_methods, get_method, get_method_class  # noqa: E402

MIXED = "mixed"
# Each method from its defaults upward; the escalation's "stronger" is the second rung of each.
GRID: dict[str, list[dict[str, Any]]] = {
    "puf-special": [{}, {"eta_u": 4.0, "unlearn_epochs": 2}],
    "puf-regular": [{}, {"eta_u": 40.0, "unlearn_epochs": 2}],
    "hf-kcu": [{}],
    "ga": [{}],
    "finetune": [{}],
    "fedquit": [{"rounds": 3, "recovery_rounds": 0}, {}, {"rounds": 8}],
}


def grid(methods: list[str], extra: dict[str, list[dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    supported = set(available_methods("hfl", "sample"))
    chosen = {**GRID, **extra}
    return [(m, options) for m in methods if m in supported for options in chosen.get(m, [{}])]


def draw_forget_set(kind: str, seed: int, setup) -> ForgetSet:
    """``mixed<C>+<O>``: C canaries and O ordinary training samples, seeded; else ``draw_batch``'s kinds."""
    federation = setup.federation
    if not kind.startswith(MIXED):
        return draw_batch(kind, seed, federation.clients, setup.client_order, setup.canaries)
    canaries, ordinary = (int(part) for part in kind[len(MIXED):].split("+"))
    rng = np.random.default_rng([seed, 0x313])
    ids = np.concatenate([c.sample_ids for c in federation.clients])
    plain = ids[~np.isin(ids, setup.canaries)]
    chosen = np.concatenate([rng.choice(setup.canaries, size=canaries, replace=False),
                             rng.choice(plain, size=ordinary, replace=False)])
    return ForgetSet.for_sample_ids(chosen, federation.clients)


def part_accuracies(model, forget, canaries: list[str]) -> dict[str, float]:
    """Accuracy on the forget set's canaries (their planted labels) and on its ordinary samples."""
    correct = correctness(model, forget)
    is_canary = np.isin(forget.sample_ids, canaries)
    mean = lambda mask: float(correct[mask].mean()) if mask.any() else float("nan")
    return {"canary_planted_acc": mean(is_canary), "ordinary_acc": mean(~is_canary)}


def run_candidate(setup, evaluator: Evaluator, sets, batch, source_eval, audit_source, method: str,
                  options: dict[str, Any], gates: PromotionGates) -> dict[str, Any]:
    federation, references = setup.federation, setup.references
    if "target_test_acc" in inspect.signature(get_method_class(method, "hfl")).parameters:
        options = {"target_test_acc": source_eval.test_acc, **options}  # as a deletion batch tells PUF
    # As a deletion batch does: a removal method acts on what the source is measured to remember.
    batch = batch.with_remembered(audit_source.removal_targets())
    outcome = get_method(method, setting="hfl", kind="sample", **options).unlearn(
        dataclasses.replace(federation, state=setup.original.state), batch)
    model = federation.model_from(outcome.state)
    evaluation = evaluator.evaluate(model)
    audit = audit_forgetting(model, sets.forget, references, seed=setup.params.seed)
    equivalence, per_sample = audit.equivalence_check(), audit.per_sample_check(audit_source)
    gate = judge(evaluation, EMPIRICAL_ONLY, source=source_eval, reference=None, gates=gates,
                 audit=audit.as_check(), source_audit=audit_source.as_check(),
                 audit_equivalence=equivalence, atypical=audit.atypical, per_sample=per_sample)
    return {"method": method, "options": options, "seconds": outcome.cost.wall_seconds, "flops": outcome.cost.flops,
            "test_acc": evaluation.test_acc, "forget_acc": evaluation.forget_acc, "auc": audit.auc,
            "interval": list(audit.interval), "margin": audit.margin, "per_sample": per_sample.verdict,
            "equivalence": equivalence.verdict, "interim": gate.interim, "held_back": gate.held_back,
            **part_accuracies(model, sets.forget, setup.canaries)}


def run_draw(setup, seed: int, kind: str, methods: list[tuple[str, dict[str, Any]]],
             gates: PromotionGates) -> dict[str, Any]:
    federation = setup.federation
    batch = draw_forget_set(kind, seed, setup)
    sets = evaluation_sets(federation, batch)
    evaluator = Evaluator(federation, batch, sets=sets, shadow_model=setup.shadow)
    source_model = federation.model_from(setup.original.state)
    source_eval = evaluator.evaluate(source_model)
    audit_source = audit_forgetting(source_model, sets.forget, setup.references, seed=setup.params.seed)
    retrain = run_candidate(setup, evaluator, sets, batch, source_eval, audit_source, "retrain", {}, gates)
    record = {"seed": seed, "kind": kind, "n_forget": batch.num_forget, "source_auc": audit_source.auc,
              "source_remembered": audit_source.remembered(), "source_removal_wanted": audit_source.removal_wanted(), "source_per_sample": audit_source.per_sample_summary(),
              "source_test_acc": source_eval.test_acc, "retrain": retrain, "candidates": [],
              "source": part_accuracies(source_model, sets.forget, setup.canaries)}
    for method, options in methods:
        row = run_candidate(setup, evaluator, sets, batch, source_eval, audit_source, method, options, gates)
        row["flops_ratio"] = retrain["flops"] / row["flops"] if row["flops"] else float("inf")
        row["seconds_ratio"] = retrain["seconds"] / row["seconds"] if row["seconds"] else float("inf")
        row["test_acc_vs_retrain"] = row["test_acc"] - retrain["test_acc"]
        for part in ("canary_planted_acc", "ordinary_acc"):
            row[f"{part}_vs_retrain"] = row[part] - retrain[part]
        record["candidates"].append(row)
        print(f"  seed {seed} {method:12s} {json.dumps(options):60s} AUC {row['auc']:.3f} {row['equivalence']:12s} "
              f"interim {row['interim']!s:5s} retrain/this: {row['seconds_ratio']:.1f}x s, "
              f"{row['flops_ratio']:.1f}x FLOPs, test {row['test_acc_vs_retrain']:+.3f}", flush=True)
    print(f"draw {seed}: source AUC {audit_source.auc:.3f}, retrain AUC {retrain['auc']:.3f} "
          f"({retrain['seconds']:.1f} s)", flush=True)
    return record


def label(options: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items() if k != "target_test_acc") or "defaults"


def effective(method: str, options: dict[str, Any]) -> str:
    """A run's settings as the method applies them, its defaults filled in (what a policy's attempt
    and a grid row have in common however each spells them)."""
    params = get_method(method, setting="hfl", **options).get_params()
    return json.dumps({k: v for k, v in params.items() if k != "target_test_acc"}, sort_keys=True, default=str)


def escalation_run(draw: dict[str, Any], setting: str = "hfl", kind: str = "sample") -> dict[str, Any] | None:
    """What a deletion batch's default escalation would have run on this draw, rebuilt from the
    draw's runs: the attempts of ``default_escalation``, in the order the batch puts them in for its
    source's audit (``batch_order``), until one may serve on the interim tier, their costs
    summed (orchestration and evaluation not counted); the exact retrain if none may. None when the
    grid lacks an attempt of the chain."""
    runs = {(r["method"], effective(r["method"], r["options"])): r for r in draw["candidates"]}
    policy = batch_order(default_escalation(setting, kind, Attempt(method=default_method(setting))), setting,
                         exact_only=False, removal_wanted=bool(draw.get("source_removal_wanted",
                                                                        draw.get("source_remembered"))),
                         chosen_by_user=False)
    seconds = flops = 0.0
    for attempt in policy:
        if attempt.exact:
            served = draw["retrain"]
        else:
            served = runs.get((attempt.method, effective(attempt.method, attempt.options)))
            if served is None:
                return None
        seconds, flops = seconds + served["seconds"], flops + served["flops"]
        if attempt.exact or served["interim"]:
            break
    retrain = draw["retrain"]
    return {"method": "escalation", "options": " → ".join(a.method for a in policy), "served_by": served["method"],
            "seconds": seconds, "flops": flops, "interim": served is not retrain, "auc": served["auc"],
            "equivalence": served["equivalence"], "seconds_ratio": retrain["seconds"] / seconds,
            "flops_ratio": retrain["flops"] / flops, "test_acc_vs_retrain": served["test_acc"] - retrain["test_acc"],
            **{f"{part}_vs_retrain": served.get(part, np.nan) - retrain.get(part, np.nan)
               for part in ("canary_planted_acc", "ordinary_acc")}}


def summarise(draws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (method, options) over the draws, the retrain judged as a candidate first."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for draw in draws:
        groups[("retrain", "as a candidate")].append({**draw["retrain"], "seconds_ratio": 1.0, "flops_ratio": 1.0,
                                                      "test_acc_vs_retrain": 0.0, "canary_planted_acc_vs_retrain": 0.0,
                                                      "ordinary_acc_vs_retrain": 0.0})
        for row in draw["candidates"]:
            groups[(row["method"], label(row["options"]))].append(row)
        chain = escalation_run(draw)
        if chain is not None:
            groups[("escalation (a batch's default policy)", chain["options"])].append(chain)
    rows = []
    for (method, options), runs in groups.items():
        served = sum(bool(r["interim"]) for r in runs)
        low, high = clopper_pearson(served, len(runs))
        rows.append({"method": method, "options": options, "earlier": any(r.get("earlier") for r in runs),
                     "draws": len(runs), "served": served,
                     "served_interval": [low, high], "auc_mean": float(np.mean([r["auc"] for r in runs])),
                     "auc_range": [float(min(r["auc"] for r in runs)), float(max(r["auc"] for r in runs))],
                     "seconds_ratio": float(np.median([r["seconds_ratio"] for r in runs])),
                     "flops_ratio": float(np.median([r["flops_ratio"] for r in runs])),
                     "test_acc_vs_retrain": float(np.mean([r["test_acc_vs_retrain"] for r in runs])),
                     "within_a_point": sum(r["test_acc_vs_retrain"] >= -0.01 for r in runs),
                     **{f"{part}_vs_retrain": float(np.nanmean([r.get(f"{part}_vs_retrain", np.nan) for r in runs]))
                        for part in ("canary_planted_acc", "ordinary_acc")},
                     "equivalence": {v: sum(r["equivalence"] == v for r in runs) for v in ("pass", "inconclusive",
                                                                                           "fail")}})
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    commands = meta.get("commands") or [meta["command"]]
    lines = [f"{meta['scenario']}, {meta['kind']}, {rows[0]['draws']} draws: "
             + "; ".join(f"`{c}`" for c in commands) + " († from an earlier output of the merge)", "",
             "| method | options | serves on the interim tier | audit AUC mean (range) | audit equivalent / "
             "inconclusive / apart | retrain ÷ method, FLOPs (median) | retrain ÷ method, seconds (median) | "
             "test accuracy − retrain's (mean) | test accuracy at most 1 point below the retrain's | "
             "deleted canaries' planted-label accuracy − retrain's (mean) | deleted ordinary samples' accuracy − "
             "retrain's (mean) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["served_interval"]
        eq = r["equivalence"]
        note = " †" if r.get("earlier") else ""  # † measured by an earlier output of the merge
        lines.append(f"| {r['method']} | {r['options']}{note} | {r['served']}/{r['draws']} [{low:.2f}, {high:.2f}] | "
                     f"{r['auc_mean']:.3f} ({r['auc_range'][0]:.3f}–{r['auc_range'][1]:.3f}) | "
                     f"{eq['pass']} / {eq['inconclusive']} / {eq['fail']} | {r['flops_ratio']:.1f}× | "
                     f"{r['seconds_ratio']:.1f}× | {r['test_acc_vs_retrain']:+.3f} | {r['within_a_point']}/{r['draws']} | "
                     f"{r.get('canary_planted_acc_vs_retrain', float('nan')):+.3f} | "
                     f"{r.get('ordinary_acc_vs_retrain', float('nan')):+.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], margin: float, path: Path) -> None:
    """Cost ratio (retrain ÷ method, FLOPs, log scale) against the audit's AUC, one line per method
    through its strengths; the band the interim tier accepts shaded."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9.5, 4.2))
    axes = figure.subplots()
    by_method: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_method[r["method"]].append(r)
    for method, points in by_method.items():
        points = sorted(points, key=lambda r: r["flops_ratio"], reverse=True)
        axes.plot([p["auc_mean"] for p in points], [p["flops_ratio"] for p in points], marker="o", label=method)
    axes.axvline(0.5, color="0.5", linestyle=":")
    if margin:
        axes.axvspan(0.5 - margin, 0.5 + margin, color="0.9")
    axes.set_yscale("log")
    axes.set_xlabel("audit AUC of the forget set against never-seen samples (mean over draws)")
    axes.set_ylabel("exact retrain ÷ method (FLOPs)")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: points fill the axes
    figure.subplots_adjust(left=0.09, right=0.72, top=0.96, bottom=0.13)
    figure.savefig(path, format="png", dpi=110)


def write(out: Path, meta: dict[str, Any], draws: list[dict[str, Any]]) -> str:
    rows = summarise(draws)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "draws": draws, "rows": rows}, indent=1,
                                                   default=float))
    text = markdown(rows, meta)
    out.with_suffix(".md").write_text(text)
    plot(rows, float(np.mean([d["retrain"]["margin"] for d in draws])), out.with_suffix(".png"))
    return text


def merged_draws(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The draws of several outputs, by seed. Where outputs share a seed (the same forget set of the
    same original), the later output's draw is kept — its retrain, its source — and each earlier
    output adds the runs of settings it alone has, marked ``earlier``: their ratios stay against their
    own run's retrain."""
    by_seed: dict[int, dict[str, Any]] = {}
    for draws in parts:
        for draw in draws:
            earlier = by_seed.get(draw["seed"])
            if earlier is not None:
                have = {(r["method"], effective(r["method"], r["options"])) for r in draw["candidates"]}
                draw = {**draw, "candidates": draw["candidates"] + [
                    {**r, "earlier": True} for r in earlier["candidates"]
                    if (r["method"], effective(r["method"], r["options"])) not in have]}
            by_seed[draw["seed"]] = draw
    return [by_seed[seed] for seed in sorted(by_seed)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/fr", help="a workspace with the scenario's data prepared")
    parser.add_argument("--scenario", default="mnist5k-canary-hfl")
    parser.add_argument("--kind", default="canaries40", help="canaries<N>, mixed<C>+<O> (C canaries and O ordinary "
                        "samples), N random samples or 'client'; several, comma-separated, share the original "
                        "(written to <out>-<kind>)")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--first-draw", type=int, default=0)
    parser.add_argument("--methods", default=",".join(GRID), help="comma-separated registered HFL methods")
    parser.add_argument("--grid", type=json.loads, default={}, metavar="JSON",
                        help='more strengths per method, e.g. \'{"puf-special": [{"eta_u": 6.0}]}\'')
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--merge", nargs="+", type=Path, help="join earlier outputs (their .json) into --out")
    parser.add_argument("--out", type=Path, default=Path("/tmp/frontier"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        meta = {**parts[-1]["meta"], "merged": [str(p) for p in args.merge],
                "commands": [c for p in parts for c in p["meta"].get("commands", [p["meta"]["command"]])]}
        print(write(args.out, meta, merged_draws([p["draws"] for p in parts])))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    root, gates = Path(args.root), PromotionGates()
    params = load_params(root / "params.yaml")
    setup_args = argparse.Namespace(scenario=args.scenario, rounds=None)
    setup = build_setup(setup_args, params, root, resolve_device(args.device))
    setup.federation.calibration = setup.references.calibration_rows(setup.federation.test)
    methods = grid([m.strip() for m in args.methods.split(",")], args.grid)
    meta = {"scenario": args.scenario, "kind": args.kind, "command": "python scripts/frontier.py " + " ".join(sys.argv[1:]),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads", "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(), "setup": setup.timings, "grid": methods}
    kinds = args.kind.split(",")  # several kinds share the setup (the original's training); one output each
    for kind in kinds:
        out = args.out if len(kinds) == 1 else args.out.with_name(f"{args.out.name}-{kind}")
        kind_meta, draws = {**meta, "kind": kind}, []
        for seed in range(args.first_draw, args.first_draw + args.draws):
            started = time.perf_counter()
            draws.append(run_draw(setup, seed, kind, methods, gates))
            draws[-1]["seconds"] = time.perf_counter() - started
            write(out, kind_meta, draws)
        kind_meta["load_average_at_end"] = os.getloadavg()
        print(write(out, kind_meta, draws))


if __name__ == "__main__":
    main()

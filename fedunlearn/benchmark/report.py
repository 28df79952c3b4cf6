"""Benchmark outputs: ``results.json`` (one row per model), ``results.md``, certificates and
plots (accuracy over rounds, ROC curves of the attacks, |Δ to retrain| per method)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from fedunlearn.evaluation.mia import AttackResult  # noqa: E402
from fedunlearn.unlearning.escalation import is_exact_retrain  # noqa: E402

GAP_KEYS = ("test_acc", "forget_acc", "mia_auc", "bd_asr")
SUMMARY_KEYS = ("method", "test_acc", "retain_acc", "forget_acc", "mia_auc", "bd_asr", "wall_seconds",
                "speedup_vs_retrain", "flops", "comm_bytes", "certificate")


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1000 or (value and abs(value) < 0.001) else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def markdown_table(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(row.get(k)) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def attack_table(rows: list[dict[str, Any]]) -> str:
    attacks = sorted({k.split("_")[1] for row in rows for k in row if k.startswith("mia_") and k.endswith("_auc")
                      and k != "mia_auc"})
    keys = ("method", *[f"mia_{a}_{m}" for a in attacks for m in ("auc", "tpr_at_1fpr", "accuracy")])
    if any("ulira_auc" in row for row in rows):
        keys += ("ulira_auc", "ulira_tpr_at_1fpr")
    return markdown_table(rows, keys)


def write_report(out: Path, rows: list[dict[str, Any]], attacks: dict[str, dict[str, AttackResult]],
                 histories: dict[str, list[dict[str, Any]]], header: dict[str, Any]) -> list[Path]:
    """Write every output file into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    md = [f"# Benchmark: {header['scenario']}, request `{header['request']}`", "",
          "| " + " | ".join(f"{k}: {v}" for k, v in header.items()) + " |", "",
          "## Results (|Δ| to retrain in the gap columns)", "",
          markdown_table(rows, SUMMARY_KEYS), "",
          markdown_table(rows, ("method", *[f"abs_gap_{k}" for k in GAP_KEYS], "output_kl",
                                "prediction_agreement")), "",
          "## Membership inference (forget set vs. label-matched held-out data)", "", attack_table(rows), ""]
    (out / "results.md").write_text("\n".join(md))
    return [out / "results.json", out / "results.md", plot_histories(out, histories), plot_rocs(out, attacks),
            plot_gaps(out, rows)]


def plot_histories(out: Path, histories: dict[str, list[dict[str, Any]]]) -> Path:
    fig, (ax_test, ax_forget) = plt.subplots(1, 2, figsize=(11, 4))
    for name, history in histories.items():
        if not history:
            continue
        steps = range(1, len(history) + 1)
        ax_test.plot(steps, [h["test_acc"] for h in history], marker=".", label=name)
        ax_forget.plot(steps, [h["forget_acc"] for h in history], marker=".", label=name)
    for ax, title in ((ax_test, "test accuracy"), (ax_forget, "forget-set accuracy")):
        ax.set_title(title + " per round (training, unlearning, recovery)")
        ax.set_xlabel("round of the run")
        ax.legend(fontsize=7)
    return _save(fig, out / "accuracy_over_rounds.png")


def plot_rocs(out: Path, attacks: dict[str, dict[str, AttackResult]]) -> Path:
    names = sorted({a for per_method in attacks.values() for a in per_method})
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(4.5 * max(len(names), 1), 4), squeeze=False)
    for ax, attack in zip(axes[0], names):
        for method, per_method in attacks.items():
            result = per_method.get(attack)
            if result is not None:
                ax.plot(result.fpr, result.tpr, label=f"{method} (AUC {result.auc:.2f})")
        ax.plot([0, 1], [0, 1], "k:", linewidth=0.8)
        ax.set_title(f"{attack} attack ROC")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.legend(fontsize=7)
    return _save(fig, out / "attack_roc.png")


def plot_gaps(out: Path, rows: list[dict[str, Any]]) -> Path:
    methods = [r for r in rows if not is_exact_retrain(r["method"])]
    keys = [k for k in GAP_KEYS if any(r.get(f"abs_gap_{k}") is not None for r in methods)]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(methods)), 4))
    width = 0.8 / max(len(keys), 1)
    for i, key in enumerate(keys):
        values = [r.get(f"abs_gap_{key}") or 0.0 for r in methods]
        ax.bar([j + i * width for j in range(len(methods))], values, width, label=f"|Δ {key}|")
    ax.set_xticks([j + width * (len(keys) - 1) / 2 for j in range(len(methods))], [r["method"] for r in methods])
    ax.set_title("absolute gap to the retrained model (lower is closer)")
    ax.legend(fontsize=8)
    return _save(fig, out / "gap_to_retrain.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

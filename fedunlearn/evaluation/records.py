"""Typed records of what an evaluation measured, shared by the benchmark, the flows, the registry
and the receipts (instead of dicts of string keys):

* ``Evaluation`` — one model on one batch's evaluation sets: the headline metrics, every attack's
  and class-removal figure (``extra``), and the evidence a gate needs to judge a metric with its
  uncertainty (per-sample correctness, attack scores, backdoor hits). Evidence stays in memory:
  it is derived from user data and never goes into an artifact.
* ``VersionMetrics`` — the metric keys every registered model version's run carries (original,
  retrained and unlearned alike), so MLflow's compare view and ``fedunlearn compare`` line them up;
  a metric that cannot be measured for a version is NaN, never left out.
* ``ResultRow`` — one row of a benchmark's ``results.json`` (its keys are a contract: ``ROW_KEYS``
  first, then every other figure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedunlearn.federation.cost import Cost
from fedunlearn.evaluation.metrics import gaps_to_reference
from fedunlearn.evaluation.mia import AttackResult

VERSION_METRICS = ("test_acc", "retain_acc", "forget_acc", "mia_auc", "wall_seconds", "flops", "comm_bytes")
ROW_KEYS = ("method", "scenario", "request", "test_acc", "retain_acc", "forget_acc", "mia_auc", "bd_asr",
            "wall_seconds", "flops", "comm_bytes", "speedup_vs_retrain", "certificate")
GAP_KEYS = ("test_acc", "retain_acc", "forget_acc", "mia_auc", "bd_asr")


@dataclass
class Evidence:
    """The per-sample outcomes behind the metrics: ``correct[split]`` (test, retain, forget) in
    the evaluation sets' fixed order, so two models are compared sample by sample."""

    correct: dict[str, np.ndarray] = field(default_factory=dict)
    attacks: dict[str, AttackResult] = field(default_factory=dict)
    backdoor_hits: np.ndarray | None = None
    num_classes: int | None = None  # C, for a class request's chance level 1/C (None: not known)


@dataclass
class Evaluation:
    test_acc: float
    retain_acc: float
    forget_acc: float
    mia_auc: float
    bd_asr: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # every attack's figures, class-removal splits, distance
    evidence: Evidence = field(default_factory=Evidence, repr=False)

    def metrics(self) -> dict[str, Any]:
        """Flat metrics: the headline keys first, then ``extra``."""
        return {"test_acc": self.test_acc, "retain_acc": self.retain_acc, "forget_acc": self.forget_acc,
                "mia_auc": self.mia_auc, "bd_asr": self.bd_asr, **self.extra}


def _measured(value: float | None) -> float:
    return math.nan if value is None else float(value)


@dataclass
class VersionMetrics:
    test_acc: float = math.nan
    retain_acc: float = math.nan
    forget_acc: float = math.nan
    mia_auc: float = math.nan
    wall_seconds: float = math.nan
    flops: float = math.nan
    comm_bytes: float = math.nan
    bd_asr: float | None = None  # logged only for scenarios trained with a backdoor

    @classmethod
    def of(cls, evaluation: Evaluation | None, cost: Cost | None) -> "VersionMetrics":
        metrics = cls()
        if evaluation is not None:
            metrics.test_acc, metrics.retain_acc = evaluation.test_acc, evaluation.retain_acc
            metrics.forget_acc, metrics.mia_auc, metrics.bd_asr = (evaluation.forget_acc, evaluation.mia_auc,
                                                                   evaluation.bd_asr)
        if cost is not None:
            metrics.wall_seconds, metrics.flops, metrics.comm_bytes = (cost.wall_seconds, cost.flops,
                                                                       float(cost.comm_bytes))
        return metrics

    @classmethod
    def from_dict(cls, values: dict[str, float]) -> "VersionMetrics":
        return cls(**{key: _measured(values.get(key)) for key in VERSION_METRICS},
                   bd_asr=values.get("bd_asr"))

    def to_dict(self) -> dict[str, float]:
        """Every ``VERSION_METRICS`` key (NaN where unmeasured), ``bd_asr`` where it was measured."""
        values = {key: _measured(getattr(self, key)) for key in VERSION_METRICS}
        return {**values, **({"bd_asr": float(self.bd_asr)} if self.bd_asr is not None else {})}


@dataclass
class ResultRow:
    """One model of a benchmark (or the unlearned model of a batch), next to retraining."""

    method: str
    scenario: str
    request: str
    evaluation: Evaluation
    cost: Cost
    certificate: str
    forget_samples: int
    retrain_cost: Cost | None = None
    retrain: Evaluation | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup_vs_retrain(self) -> float | None:
        if self.retrain_cost is None or not self.cost.wall_seconds > 0:
            return None
        return self.retrain_cost.wall_seconds / self.cost.wall_seconds

    def to_dict(self) -> dict[str, Any]:
        """The results row: ``ROW_KEYS`` first, then every attack's figures, the gaps to retrain,
        the functional distance and the notes."""
        metrics = self.evaluation.metrics()
        row: dict[str, Any] = {
            "method": self.method, "scenario": self.scenario, "request": self.request,
            **{key: metrics[key] for key in ("test_acc", "retain_acc", "forget_acc", "mia_auc", "bd_asr")},
            "wall_seconds": self.cost.wall_seconds, "flops": self.cost.flops, "comm_bytes": self.cost.comm_bytes,
            "speedup_vs_retrain": self.speedup_vs_retrain, "certificate": self.certificate}
        row.update({k: v for k, v in metrics.items() if k not in row})
        if self.retrain is not None:
            row.update(gaps_to_reference(metrics, self.retrain.metrics(), keys=GAP_KEYS))
        row["forget_samples"] = self.forget_samples
        row["notes"] = self.notes
        return row

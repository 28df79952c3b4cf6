"""The regression guard of ``fedunlearn benchmark --compare OLD.json``: every method of a stored
baseline (an earlier ``results.json`` of the same scenario and request) is checked against the
new run, and a method is flagged when

* its forgetting quality got worse: a gap to retrain (|Δ| of forget accuracy, MIA AUC, backdoor
  success, test accuracy) grew by more than ``quality_tolerance`` (absolute, default 0.02);
* its speed-up over retrain fell by more than ``speed_tolerance`` (relative, default 0.25 —
  wall times on a shared machine vary by tens of percent, the ratio less, since retrain ran in
  the same conditions);
* its certificate class got weaker (``formal (ε,δ)`` → ``empirical only`` → ``not certified``);
* or it is missing from the new run.

Gaps and speed-ups are relative to the retrain of the same run, so a baseline from another
machine still compares ratios, not seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedunlearn.certify.certificate import (BOUNDED_APPROXIMATION, CONSTRAINT_SATISFIED, EMPIRICAL_ONLY,
                                            EXACT_RETRAIN, FORMAL, NOT_CERTIFIED)
from fedunlearn.user_files import read_capped

QUALITY_GAPS = ("abs_gap_forget_acc", "abs_gap_mia_auc", "abs_gap_bd_asr", "abs_gap_test_acc")
SPEEDUP = "speedup_vs_retrain"
REFERENCE_ROWS = ("original", "retrain")
# A results.json holds a row per method (kilobytes); the cap only stops a wrong path being read whole.
MAX_BASELINE_BYTES = 64 << 20
# Certificate classes from the strongest claim to none; moving right is a regression.
STRENGTH = (EXACT_RETRAIN, FORMAL, CONSTRAINT_SATISFIED, BOUNDED_APPROXIMATION, EMPIRICAL_ONLY, NOT_CERTIFIED)


@dataclass
class Finding:
    method: str
    check: str
    baseline: Any
    current: Any
    verdict: str  # "regression" or "ok"


@dataclass
class Comparison:
    scenario: str
    request: str
    quality_tolerance: float
    speed_tolerance: float
    findings: list[Finding] = field(default_factory=list)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == "regression"]

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "regressions": len(self.regressions)}, indent=2, default=str) + "\n"

    def markdown(self) -> str:
        lines = [f"Regression check against the baseline ({self.scenario}, {self.request}; gaps may grow by "
                 f"{self.quality_tolerance}, speed-ups may fall by {self.speed_tolerance:.0%}):", "",
                 "| method | check | baseline | now | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {f.method} | {f.check} | {_show(f.baseline)} | {_show(f.current)} | {f.verdict} |"
                  for f in self.findings]
        lines += ["", f"{len(self.regressions)} regression(s)" if self.regressions else "no regressions"]
        return "\n".join(lines)


def load_baseline(path: Path) -> list[dict[str, Any]]:
    """An earlier ``results.json``: a list of rows, each with a ``method``."""
    if not Path(path).is_file():
        raise ValueError(f"baseline {path} not found (or not a regular file): pass the results.json of an earlier "
                         "benchmark run")
    data = read_capped(path, "a benchmark's results.json", MAX_BASELINE_BYTES,
                       "pass the results.json of an earlier benchmark run")
    try:
        rows = json.loads(data)
    except UnicodeDecodeError:
        raise ValueError(f"baseline {path} is not UTF-8 text: pass the results.json of an earlier benchmark "
                         "run") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"baseline {path} is not JSON ({err}): pass the results.json of an earlier benchmark "
                         "run") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "method" in r for r in rows):
        raise ValueError(f"baseline {path} is not a benchmark results.json (a list of rows with a 'method')")
    return rows


def compare(current: list[dict[str, Any]], baseline: list[dict[str, Any]], *, quality_tolerance: float = 0.02,
            speed_tolerance: float = 0.25) -> Comparison:
    if quality_tolerance < 0 or not 0 <= speed_tolerance < 1:
        raise ValueError("quality_tolerance must be >= 0 and speed_tolerance in [0, 1)")
    scenario, request = _identity(current, "the new run")
    require_same_run(baseline, scenario, request)
    result = Comparison(scenario, request, quality_tolerance, speed_tolerance)
    now = {row["method"]: row for row in current}
    for old in baseline:
        method = old["method"]
        if method in REFERENCE_ROWS:
            continue
        new = now.get(method)
        if new is None:
            result.findings.append(Finding(method, "present", True, False, "regression"))
            continue
        result.findings += [_gap(method, key, old.get(key), new.get(key), quality_tolerance) for key in QUALITY_GAPS
                            if _number(old.get(key)) is not None]
        if _number(old.get(SPEEDUP)) is not None:
            result.findings.append(_speedup(method, old[SPEEDUP], new.get(SPEEDUP), speed_tolerance))
        result.findings.append(_certificate(method, old.get("certificate"), new.get("certificate")))
    return result


def require_same_run(baseline: list[dict[str, Any]], scenario: str, request: str) -> None:
    if _identity(baseline, "the baseline") != (scenario, request):
        raise ValueError(f"the baseline is for {_identity(baseline, 'the baseline')}, this run for "
                         f"{(scenario, request)}: compare runs of the same scenario and request")


def _identity(rows: list[dict[str, Any]], what: str) -> tuple[str, str]:
    pairs = {(r.get("scenario"), r.get("request")) for r in rows}
    if len(pairs) != 1:
        raise ValueError(f"{what} mixes scenarios or requests: {sorted(map(str, pairs))}")
    return pairs.pop()


def _gap(method: str, key: str, old: Any, new: Any, tolerance: float) -> Finding:
    worse = _number(new) is None or new > old + tolerance
    return Finding(method, key, old, new, "regression" if worse else "ok")


def _speedup(method: str, old: float, new: Any, tolerance: float) -> Finding:
    worse = _number(new) is None or new < old * (1 - tolerance)
    return Finding(method, SPEEDUP, old, new, "regression" if worse else "ok")


def _certificate(method: str, old: Any, new: Any) -> Finding:
    rank = {g: i for i, g in enumerate(STRENGTH)}
    worse = rank.get(new, len(STRENGTH)) > rank.get(old, len(STRENGTH))
    return Finding(method, "certificate", old, new, "regression" if worse else "ok")


def _number(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

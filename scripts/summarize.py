"""Print a compact markdown table of a benchmark's results.json (used for docs/BENCHMARKS.md)."""

import json
import sys

KEYS = ("method", "test_acc", "retain_acc", "forget_acc", "mia_auc", "bd_asr", "remaining_classes_test_acc",
        "wall_seconds", "speedup_vs_retrain", "certificate")


def fmt(value):
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 10 else f"{value:.3f}"
    return str(value)


for path in sys.argv[1:]:
    rows = json.load(open(path))
    keys = [k for k in KEYS if any(r.get(k) is not None for r in rows)]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(fmt(row.get(k)) for k in keys) + " |")
    print()

"""Small and mixed deletion requests on a memorising scenario, end to end as a user runs them: a
fresh workspace, the scenario trained, then requests of 1, 2 and 4 memorised canaries and one mixed
request (memorised canaries and ordinary samples), each `fedunlearn request` + `fedunlearn process`
with default settings, one at a time; then `fedunlearn repay-debt` (the exact retrain). For each
request: the served version's accuracy on the deleted canaries' planted labels and on the deleted
ordinary samples, against the source's and the exact retrain's, and the batch's FLOPs against the
retrain's (docs/BENCHMARKS.md, "Small and mixed requests, end to end").

    .venv/bin/python scripts/small_requests.py --root /tmp/small --scenario digits-canary-hfl \\
        --sizes 1,2,4 --mixed 30+10 --out /tmp/small_requests

The deleted samples' tensors are read before any deletion (from the partition the user trained on)
and kept in memory only, to measure the served versions on them afterwards.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedunlearn.config import load_params
from fedunlearn.data.store import canary_ids, read_manifest
from fedunlearn.evaluation.evaluator import correctness
from fedunlearn.federation.local import Tensors
from fedunlearn.receipts import read_receipts
from fedunlearn.training import load_federation
from stores.workspace import Workspace

CLI = str(Path(sys.executable).with_name("fedunlearn"))


def cli(root: Path, *args: str) -> None:
    started = time.perf_counter()
    done = subprocess.run([CLI, "--root", str(root), *args], capture_output=True, text=True)
    print(f"$ fedunlearn {' '.join(args[:3])} … → {done.returncode} ({time.perf_counter() - started:.0f} s)",
          flush=True)
    if done.returncode != 0:
        sys.exit(f"fedunlearn {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def served_model(root: Path, scenario: str, federation):
    """The version behind alias ``current`` (the original before any batch moved it)."""
    registry = Workspace.open(root).registry
    alias = "current" if registry.by_alias(scenario, "current") is not None else "original"
    return federation.model_from(registry.load(scenario, alias=alias).state)


def accuracies(model, data: Tensors, canaries: np.ndarray) -> dict[str, float]:
    correct, is_canary = correctness(model, data), np.isin(data.sample_ids, canaries)
    mean = lambda mask: float(correct[mask].mean()) if mask.any() else None
    return {"canary_planted_acc": mean(is_canary), "ordinary_acc": mean(~is_canary)}


def pick_requests(federation, model, canaries: np.ndarray, sizes: list[int], mixed: tuple[int, int],
                  seed: int) -> list[np.ndarray]:
    """Disjoint requests: memorised canaries (the source predicts their planted labels) per size,
    then the mixed one (memorised canaries and ordinary samples the source gets right)."""
    data = Tensors(torch.cat([c.x for c in federation.clients]), torch.cat([c.y for c in federation.clients]),
                   np.concatenate([c.sample_ids for c in federation.clients]))
    correct, is_canary = correctness(model, data), np.isin(data.sample_ids, canaries)
    memorised = np.random.default_rng(seed).permutation(data.sample_ids[is_canary & correct])
    ordinary = np.random.default_rng(seed + 1).permutation(data.sample_ids[~is_canary & correct])
    requests, used = [], 0
    for n in sizes:
        requests.append(memorised[used:used + n])
        used += n
    if sum(mixed):
        requests.append(np.concatenate([memorised[used:used + mixed[0]], ordinary[:mixed[1]]]))
    return requests, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="a new workspace folder")
    parser.add_argument("--scenario", default="digits-canary-hfl")
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--mixed", default="30+10", help="canaries+ordinary samples of the mixed request (0+0: none)")
    parser.add_argument("--planted", type=Path, help="a JSON list of the rows a user's data holds mislabelled or "
                        "out of distribution (scripts/user_csv_scenarios.py), drawn instead of the partition's "
                        "canaries: the benchmark's ground truth, never given to the pipeline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--method", default=None, help="a method to `process` with (default: the batch's own choice)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/small_requests"))
    args = parser.parse_args()
    root, scenario = args.root, args.scenario
    if not (root / "params.yaml").exists():
        cli(root.parent, "init", str(root))
    if Workspace.open(root).registry.by_alias(scenario, "original") is None:
        cli(root, "train", "--scenario", scenario)
    federation = load_federation(scenario, load_params(root / "params.yaml"), root, torch.device("cpu"))
    canaries = np.asarray(json.loads(args.planted.read_text()) if args.planted else
                          canary_ids(read_manifest(scenario, root)))
    source = served_model(root, scenario, federation)
    requests, data = pick_requests(federation, source, canaries, [int(s) for s in args.sizes.split(",")],
                                   tuple(int(p) for p in args.mixed.split("+")), args.seed)
    rows: list[dict[str, Any]] = []
    for ids in requests:
        cli(root, "request", "samples", "--scenario", scenario, "--ids", ",".join(ids))
        cli(root, "process", "--scenario", scenario, *(["--method", args.method] if args.method else []))
        receipt = read_receipts(root, scenario)[-1]
        chosen = data.select(np.isin(data.sample_ids, ids))
        rows.append({"samples": len(ids), "canaries": int(np.isin(ids, canaries).sum()), "method": receipt.method,
                     "forgetting": receipt.forgetting, "attempts": [a.method for a in receipt.attempts],
                     "flops": receipt.metrics.get("unlearned", {}).get("flops"),
                     "batch_flops": receipt.costs.get("batch", {}).get("flops"),
                     "split": receipt.costs.get("unlearned", {}).get("split", {}),
                     "seconds": receipt.metrics.get("unlearned", {}).get("wall_seconds"),
                     "source": accuracies(source, chosen, canaries),
                     "served": accuracies(served_model(root, scenario, federation), chosen, canaries)})
        print(json.dumps(rows[-1]), flush=True)
    cli(root, "repay-debt", "--scenario", scenario)
    retrained = served_model(root, scenario, federation)
    retrain_metrics = Workspace.open(root).registry.load(scenario, alias="current").metrics
    for row, ids in zip(rows, requests):
        row["retrain"] = accuracies(retrained, data.select(np.isin(data.sample_ids, ids)), canaries)
        row["retrain_flops"], row["retrain_seconds"] = retrain_metrics.get("flops"), retrain_metrics.get("wall_seconds")
        for key, spent in (("served_ratio", row["flops"]), ("batch_ratio", row["batch_flops"])):
            row[key] = row["retrain_flops"] / spent if spent and row["retrain_flops"] else None
    args.out.with_suffix(".json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()

"""What one deleted sample's evidence can tell, both ways: at n = 1, how often the per-sample check
flags the source (a no-op) on a sample it remembers, and an exact retrain on an ordinary training
sample, as the remembered side's threshold for a sample the model predicts with a label the
references reject (``atypical_hit``) is loosened from α/2 towards 1 (docs/BENCHMARKS.md, "The
interim decision at every request size": why n = 1 stays short).

Worlds as in ``per_sample_rates`` (each partitions and trains again with its own global seed); the
remembered rows are its ground truth (the source predicts the training label, the references'
majority and the world's exact retrain, trained without the pool, do not); the ordinary rows a seeded
draw of the other training samples. Each row is audited alone (``audit_forgetting`` on one sample),
so every reading is the one a request of that row alone would get.

    .venv/bin/python scripts/per_sample_frontier.py --root /tmp/umislabel --scenario user-mislabel-hfl \\
        --planted /tmp/umislabel/user/mislabel.planted.json --worlds 5 --first-world 500 --out /tmp/frontier-mis

Writes ``<out>.json`` (every row's reading) and ``<out>.md`` (the table, Clopper–Pearson 95 %).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit_power import build_setup, fmt_rate, seeded_partition  # noqa: E402
from per_sample_rates import ground_truth, missed_by, restriction  # noqa: E402

from fedunlearn.config import load_params  # noqa: E402
from fedunlearn.device import resolve_device  # noqa: E402
from fedunlearn.evaluation.audit import audit_forgetting  # noqa: E402
from fedunlearn.evaluation.per_sample import OVER_FORGOTTEN, REMEMBERED  # noqa: E402
from fedunlearn.federation.forget_set import ForgetSet  # noqa: E402
from fedunlearn.training import train  # noqa: E402

THRESHOLDS = (None, 0.05, 0.1, 0.2, 0.5, 1.0)


def readings(model, data, references) -> list[dict[str, Any]]:
    """Each row of ``data`` audited alone: its reading, p-value of being remembered, atypical hit."""
    rows = []
    for i in range(len(data)):
        row = audit_forgetting(model, data.select(np.arange(len(data)) == i), references).samples[0]
        rows.append({key: row[key] for key in ("reading", "p_remembered", "atypical_hit")})
    return rows


@dataclasses.dataclass(frozen=True)
class World:
    """A world's setup, its remembered rows (ground truth), a seeded draw of ordinary rows, and the
    exact retrain trained without both."""

    setup: Any
    remembered: np.ndarray
    ordinary: np.ndarray
    retrained: torch.nn.Module


def world_rows(args: argparse.Namespace, params, root: Path, world: int, scratch: Path) -> World:
    setup = build_setup(args, seeded_partition(args, params, root, world, scratch), scratch, resolve_device("cpu"))
    federation = setup.federation
    remembered, others = ground_truth(setup, restriction(args, setup))
    ordinary = np.random.default_rng([world, 0x0D]).choice(others, size=min(args.ordinary, len(others)),
                                                            replace=False)
    pool = ForgetSet.for_sample_ids(np.concatenate([remembered, ordinary]), federation.clients)
    retrained = federation.model_from(train(dataclasses.replace(
        federation, clients=federation.retained_clients(pool), state={})).state)
    return World(setup, missed_by(retrained, federation, remembered), ordinary, retrained)


def run_world(args: argparse.Namespace, params, root: Path, world: int) -> dict[str, list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="per-sample-frontier-") as scratch:
        rows = world_rows(args, params, root, world, Path(scratch))
        setup, federation = rows.setup, rows.setup.federation
        data = {kind: federation.forget_data(ForgetSet.for_sample_ids(ids, federation.clients))
                for kind, ids in (("remembered", rows.remembered), ("ordinary", rows.ordinary))}
        source = federation.model_from(setup.original.state)
        print(f"world {world}: {len(rows.remembered)} remembered, {len(rows.ordinary)} ordinary rows", flush=True)
        return {"noop": readings(source, data["remembered"], setup.references),
                "retrain": readings(rows.retrained, data["ordinary"], setup.references)}


def flagged(row: dict[str, Any], threshold: float | None) -> bool:
    """The check's reading at n = 1, or with an atypical hit flagged from p ≤ ``threshold`` too."""
    if row["reading"] in (REMEMBERED, OVER_FORGOTTEN):
        return True
    return threshold is not None and row["atypical_hit"] and row["p_remembered"] <= threshold


def table(worlds: list[dict[str, list[dict[str, Any]]]]) -> str:
    noop = [row for world in worlds for row in world["noop"]]
    retrain = [row for world in worlds for row in world["retrain"]]
    lines = ["| an atypical hit is flagged at | no-op flagged (remembered rows) | exact retrain flagged (ordinary rows) |",
             "|---|---|---|"]
    for threshold in THRESHOLDS:
        label = "α/2 (the rule)" if threshold is None else f"p ≤ {threshold}"
        lines.append(f"| {label} | {fmt_rate(sum(flagged(r, threshold) for r in noop), len(noop))} | "
                     f"{fmt_rate(sum(flagged(r, threshold) for r in retrain), len(retrain))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a workspace with the scenario's data prepared")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--planted", required=True, help="a JSON list of the planted rows' IDs")
    parser.add_argument("--worlds", type=int, default=5)
    parser.add_argument("--first-world", type=int, default=500)
    parser.add_argument("--ordinary", type=int, default=60, help="ordinary rows audited per world")
    parser.add_argument("--out", default="/tmp/per_sample_frontier")
    args = parser.parse_args()
    args.truth, args.rounds = "planted", None
    torch.set_num_threads(1)
    root, out = Path(args.root), Path(args.out)
    params = load_params(root / "params.yaml")
    worlds = [run_world(args, params, root, w) for w in range(args.first_world, args.first_world + args.worlds)]
    out.with_suffix(".json").write_text(json.dumps({"command": " ".join(sys.argv), "worlds": worlds}, default=float))
    text = table(worlds)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

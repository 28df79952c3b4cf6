"""What one deleted sample's evidence could tell with references as strong as the source: at n = 1,
how often a no-op is flagged on a sample it remembers and an exact retrain on a sample it never saw,
when each sample is judged against a model trained on the source's own data *without that sample's
client* (a leave-one-client-out reference) instead of the audit set's references, which train on a
part of the held-out split (docs/BENCHMARKS.md, "The interim decision at every request size").

A diagnostic for the audit's next design, not the pipeline's rule. Worlds, ground truth and rows as
in ``per_sample_frontier`` (the same seeds give the same partitions, sources and retrains). Per
world, one extra federation per client is trained with that client left out (the scenario's own
training settings). A row x of client c is scored by d(x) = φ_cand(x) − φ_c(x), φ the logit-scaled
confidence in x's training label (LiRA's statistic, Carlini et al. 2022) and φ_c the leave-out
reference's; its p-value of being remembered is the share of held-out rows (which neither model
saw) whose d under the same pair is at least d(x), and of being over-forgotten the share at most.
Flagged: remembered at p ≤ the threshold, or over-forgotten at p ≤ α/2.

    .venv/bin/python scripts/leave_out_references.py --root /tmp/umislabel --scenario user-mislabel-hfl \\
        --planted /tmp/umislabel/user/mislabel.planted.json --worlds 5 --first-world 700 --out /tmp/loo-mis

Writes ``<out>.json`` (every row's p-values) and ``<out>.md`` (the table, Clopper–Pearson 95 %).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit_power import build_setup, fmt_rate, seeded_partition  # noqa: E402
from per_sample_rates import ground_truth, missed_by, restriction  # noqa: E402

from fedunlearn.config import load_params  # noqa: E402
from fedunlearn.device import resolve_device  # noqa: E402
from fedunlearn.federation.forget_set import ForgetSet  # noqa: E402
from fedunlearn.federation.local import predict_logits  # noqa: E402
from fedunlearn.training import train  # noqa: E402

ALPHA = 0.05
THRESHOLDS = (0.01, ALPHA / 2, 0.05, 0.1)


@torch.no_grad()
def phi(model, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """LiRA's logit-scaled confidence in label ``y``: log p_y − log(1 − p_y), computed from logits."""
    logits = predict_logits(model, x).double().cpu()
    own = logits.gather(1, y.cpu().long().view(-1, 1)).squeeze(1)
    others = logits.scatter(1, y.cpu().long().view(-1, 1), float("-inf")).logsumexp(1)
    return (own - others).numpy()


def leave_out_models(federation) -> list:
    """One model per client, trained on the other clients' data with the scenario's settings."""
    models = []
    for c in range(len(federation.clients)):
        kept = [client for i, client in enumerate(federation.clients) if i != c]
        models.append(federation.model_from(train(dataclasses.replace(federation, clients=kept, state={})).state))
    return models


def p_values(candidate, federation, references: list, sample_ids: np.ndarray) -> list[dict[str, float]]:
    """Each row's p-values against held-out rows under the same (candidate, its client's reference)."""
    test, rows = federation.test, []
    for c, client in enumerate(federation.clients):
        mine = np.isin(client.sample_ids, sample_ids)
        if not mine.any():
            continue
        null = phi(candidate, test.x, test.y) - phi(references[c], test.x, test.y)
        x, y = client.x[torch.as_tensor(mine)], client.y[torch.as_tensor(mine)]
        for d in phi(candidate, x, y) - phi(references[c], x, y):
            rows.append({"d": float(d), "p_remembered": float((1 + (null >= d).sum()) / (1 + len(null))),
                         "p_over": float((1 + (null <= d).sum()) / (1 + len(null)))})
    return rows


def run_world(args: argparse.Namespace, params, root: Path, world: int) -> dict[str, list[dict[str, float]]]:
    with tempfile.TemporaryDirectory(prefix="leave-out-references-") as scratch:
        setup = build_setup(args, seeded_partition(args, params, root, world, Path(scratch)), Path(scratch),
                            resolve_device("cpu"))
        federation = setup.federation
        remembered, others = ground_truth(setup, restriction(args, setup))
        ordinary = np.random.default_rng([world, 0x0D]).choice(others, size=min(args.ordinary, len(others)),
                                                                replace=False)
        pool = ForgetSet.for_sample_ids(np.concatenate([remembered, ordinary]), federation.clients)
        retrained = federation.model_from(train(dataclasses.replace(
            federation, clients=federation.retained_clients(pool), state={})).state)
        remembered = missed_by(retrained, federation, remembered)
        t = time.perf_counter()
        references = leave_out_models(federation)
        seconds = time.perf_counter() - t
        source = federation.model_from(setup.original.state)
        print(f"world {world}: {len(remembered)} remembered, {len(ordinary)} ordinary rows; "
              f"{len(references)} leave-out references in {seconds:.1f} s", flush=True)
        return {"noop": p_values(source, federation, references, remembered),
                "retrain_ordinary": p_values(retrained, federation, references, ordinary),
                "retrain_remembered": p_values(retrained, federation, references, remembered),
                "reference_seconds": seconds, "original_seconds": setup.timings["original_seconds"]}


def flagged(row: dict[str, float], threshold: float) -> bool:
    return row["p_remembered"] <= threshold or row["p_over"] <= ALPHA / 2


def table(worlds: list[dict]) -> str:
    columns = (("noop", "no-op flagged (remembered rows)"),
               ("retrain_ordinary", "exact retrain flagged (ordinary rows)"),
               ("retrain_remembered", "exact retrain flagged (remembered rows)"))
    lines = ["| remembered at p ≤ | " + " | ".join(label for _, label in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for threshold in THRESHOLDS:
        cells = []
        for key, _ in columns:
            rows = [row for world in worlds for row in world[key]]
            cells.append(fmt_rate(sum(flagged(r, threshold) for r in rows), len(rows)))
        lines.append(f"| {threshold:g} | " + " | ".join(cells) + " |")
    cost = sum(w["reference_seconds"] for w in worlds) / sum(w["original_seconds"] for w in worlds)
    return "\n".join(lines) + f"\n\nleave-out references' training time / the original's: {cost:.2f}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a workspace with the scenario's data prepared")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--planted", required=True, help="a JSON list of the planted rows' IDs")
    parser.add_argument("--worlds", type=int, default=5)
    parser.add_argument("--first-world", type=int, default=700)
    parser.add_argument("--ordinary", type=int, default=60, help="ordinary rows audited per world")
    parser.add_argument("--out", default="/tmp/leave_out_references")
    args = parser.parse_args()
    args.truth, args.rounds = "planted", None
    torch.set_num_threads(1)
    root, out = Path(args.root), Path(args.out)
    params = load_params(root / "params.yaml")
    worlds = [run_world(args, params, root, w) for w in range(args.first_world, args.first_world + args.worlds)]
    out.with_suffix(".json").write_text(json.dumps({"command": " ".join(sys.argv), "worlds": worlds}))
    text = table(worlds)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

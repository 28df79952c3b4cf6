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
saw) whose d under the same pair is at least d(x), and of being over-forgotten the share at most —
against all held-out rows, and against the ``--neighbours`` whose φ_c is nearest x's (a difficulty
calibration: a row the reference rejects is compared with held-out rows it rejects alike).
Flagged: at p ≤ α/2 on either side, or on the remembered side alone.

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

from audit_power import fmt_rate  # noqa: E402
from per_sample_frontier import world_rows  # noqa: E402

from fedunlearn.config import load_params  # noqa: E402
from fedunlearn.federation.local import predict_logits  # noqa: E402
from fedunlearn.training import train  # noqa: E402

ALPHA = 0.05


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


def p_values(candidate, federation, references: list, sample_ids: np.ndarray,
             neighbours: int) -> list[dict[str, float]]:
    """Each row's p-values against held-out rows under the same (candidate, its client's reference):
    all of them, and (``_near``) the ``neighbours`` whose reference score is nearest the row's."""
    test, rows = federation.test, []
    for c, client in enumerate(federation.clients):
        mine = np.isin(client.sample_ids, sample_ids)
        if not mine.any():
            continue
        held_ref = phi(references[c], test.x, test.y)
        null = phi(candidate, test.x, test.y) - held_ref
        x, y = client.x[torch.as_tensor(mine)], client.y[torch.as_tensor(mine)]
        own_ref = phi(references[c], x, y)
        for d, difficulty in zip(phi(candidate, x, y) - own_ref, own_ref):
            near = null[np.argsort(np.abs(held_ref - difficulty), kind="stable")[:neighbours]]
            rows.append({"d": float(d), **_p(null, d, ""), **_p(near, d, "_near")})
    return rows


def _p(null: np.ndarray, d: float, suffix: str) -> dict[str, float]:
    """The share of ``null`` at least (remembered) and at most (over-forgotten) ``d``, each counting d itself."""
    return {f"p_remembered{suffix}": float((1 + (null >= d).sum()) / (1 + len(null))),
            f"p_over{suffix}": float((1 + (null <= d).sum()) / (1 + len(null)))}


def run_world(args: argparse.Namespace, params, root: Path, world: int) -> dict[str, list[dict[str, float]]]:
    with tempfile.TemporaryDirectory(prefix="leave-out-references-") as scratch:
        rows = world_rows(args, params, root, world, Path(scratch))
        setup, federation = rows.setup, rows.setup.federation
        remembered, ordinary, retrained = rows.remembered, rows.ordinary, rows.retrained
        t = time.perf_counter()
        references = leave_out_models(federation)
        seconds = time.perf_counter() - t
        source = federation.model_from(setup.original.state)
        print(f"world {world}: {len(remembered)} remembered, {len(ordinary)} ordinary rows; "
              f"{len(references)} leave-out references in {seconds:.1f} s", flush=True)
        k = args.neighbours
        return {"noop": p_values(source, federation, references, remembered, k),
                "retrain_ordinary": p_values(retrained, federation, references, ordinary, k),
                "retrain_remembered": p_values(retrained, federation, references, remembered, k),
                "reference_seconds": seconds, "original_seconds": setup.timings["original_seconds"]}


# How a row is flagged: the remembered side against all held-out rows or the nearest, and the
# over-forgotten side against all, the nearest, or not read.
VARIANTS = (("remembered and over-forgotten sides, all held-out rows", "", ""),
            ("remembered side, all held-out rows; over-forgotten side, the nearest", "", "_near"),
            ("remembered side alone, all held-out rows", "", None),
            ("remembered side alone, the nearest", "_near", None))
COLUMNS = (("noop", "no-op flagged (remembered rows)"), ("retrain_ordinary", "exact retrain flagged (ordinary rows)"),
           ("retrain_remembered", "exact retrain flagged (remembered rows)"))


def flagged(row: dict[str, float], remembered: str, over: str | None) -> bool:
    """Flagged at α/2 on the remembered side (null ``remembered``) or the over-forgotten side (``over``)."""
    return row[f"p_remembered{remembered}"] <= ALPHA / 2 or (over is not None and row[f"p_over{over}"] <= ALPHA / 2)


def table(worlds: list[dict]) -> str:
    lines = ["| flagged at α/2 on | " + " | ".join(label for _, label in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for name, remembered, over in VARIANTS:
        cells = []
        for key, _ in COLUMNS:
            rows = [row for world in worlds for row in world[key]]
            cells.append(fmt_rate(sum(flagged(r, remembered, over) for r in rows), len(rows)))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cost = sum(w["reference_seconds"] for w in worlds) / sum(w["original_seconds"] for w in worlds)
    return "\n".join(lines) + f"\n\nleave-out references' training time / the original's: {cost:.2f}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="a workspace with the scenario's data prepared")
    parser.add_argument("--scenario")
    parser.add_argument("--planted", help="a JSON list of the planted rows' IDs")
    parser.add_argument("--worlds", type=int, default=5)
    parser.add_argument("--first-world", type=int, default=700)
    parser.add_argument("--ordinary", type=int, default=60, help="ordinary rows audited per world")
    parser.add_argument("--neighbours", type=int, default=40, help="held-out rows in a row's nearest null")
    parser.add_argument("--out", default="/tmp/leave_out_references")
    parser.add_argument("--table-from", help="only print the table of an earlier run's <out>.json")
    args = parser.parse_args()
    if args.table_from:
        print(table(json.loads(Path(args.table_from).read_text())["worlds"]))
        return
    if not (args.root and args.scenario and args.planted):
        parser.error("--root, --scenario and --planted are required (or --table-from)")
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

"""Accuracy against K for a federation in shards (issue 48, item 5): for each K, every shard trained
from scratch by the pipeline's own trainer (``fedunlearn.training.train_shards`` through ``train``),
the served ensemble's test accuracy, each shard's training FLOPs (the pipeline's cost record), and
the exact tier's FLOPs per request against a full retrain of the unsharded federation:

* a client request retrains that client's shard without the client (a shard left without data
  drops out of the ensemble and costs nothing);
* a sample request retrains the shard holding it (its data barely changes: its training FLOPs).

FLOPs follow PUF Appendix B as every cost record does: F · E · Σ samples per round, so a shard's
retrain without a client costs F · E · R · (shard samples − the client's samples).

    .venv/bin/fedunlearn init /tmp/sh && .venv/bin/fedunlearn --root /tmp/sh prepare --scenario mnist5k-hfl
    nice -n 10 .venv/bin/python scripts/shards_frontier.py --root /tmp/sh --scenario mnist5k-hfl \
        --shards 1 2 4 5 10 --out /tmp/shards-mnist5k-hfl.json

Writes ``--out`` (JSON, one entry per K) and prints one table row per K; ``--flops-only`` computes
the FLOPs columns from the partition without training (accuracy NaN). Each K's accuracy is also given
with equal shard weights (the ensemble before it weighed shards by their samples), and with
``--client-request C`` after client C is forgotten exactly (its shard retrained without it).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from fedunlearn.config import load_params
from fedunlearn.device import intra_op_threads
from fedunlearn.federation.cost import training_flops
from fedunlearn.federation.local import accuracy
from fedunlearn.sharded_federation import ShardedFederation
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.training import load_federation, train, trained as trained_federation
from fedunlearn.unlearning import get_method


def equal_weights(state: dict) -> dict:
    """An ensemble state serving its live shards' plain mean (as versions registered before the weights)."""
    return {**state, "weights": state["live"].clone()} if "live" in state else state


def weighings(federation, client: int | None) -> dict:
    """The served ensemble's test accuracy with equal shard weights, and, for ``client``'s request
    forgotten exactly (its shard retrained without it), the ensemble's accuracy weighted by samples
    and with equal weights."""
    def both(state: dict) -> tuple[float, float]:
        return tuple(accuracy(federation.model_from(s), federation.test) for s in (state, equal_weights(state)))

    found = {"test_acc_equal_weights": both(federation.state)[1]}
    if client is not None:
        batch = ForgetSet("client", {client: federation.clients[client].sample_ids}, clients=[client])
        weighted, equal = both(get_method("retrain", setting="hfl").unlearn(federation, batch).state)
        found["client_request"] = {"client": client, "test_acc": weighted, "test_acc_equal_weights": equal}
    return found


def measure(root: Path, scenario: str, shards: int, flops_only: bool = False, vectorised: bool = False,
            rounds: int | None = None, client: int | None = None, seed: int | None = None) -> dict:
    """One K: the ensemble trained from scratch, its accuracy (also with equal shard weights, and after
    ``client``'s request retrained exactly), per-shard and per-request FLOPs (``flops_only``: the FLOPs
    alone, nothing trained; ``vectorised``: the shards stacked; ``seed``: the training seed instead of
    params.yaml's — the assignment, initial weights, shuffling and client sampling; the partition on
    disk stays the one ``prepare`` drew)."""
    params = load_params(root / "params.yaml")
    if seed is not None:
        params = params.model_copy(update={"seed": seed})
    cfg = params.scenario(scenario)
    train_config = cfg.train.model_copy(update={"rounds": rounds or cfg.train.rounds})
    params.scenarios[scenario] = cfg = cfg.model_copy(update={"shards": shards, "shards_vectorised": vectorised,
                                                              "train": train_config})
    federation = load_federation(scenario, params, root, torch.device("cpu"))
    started, cpu = time.perf_counter(), time.process_time()
    trained = None if flops_only else train(federation)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    acc = float("nan") if trained is None else accuracy(federation.model_from(trained.state), federation.test)
    weighing = {} if trained is None else weighings(trained_federation(federation, trained), client)
    per_sample = (federation.shard(0, {}) if isinstance(federation, ShardedFederation) else federation).flops_per_sample()
    sizes = [len(c) for c in federation.clients]
    shard_of = federation.shard_of if isinstance(federation, ShardedFederation) else (0,) * len(sizes)

    def flops(samples: int) -> float:
        return training_flops(per_sample, samples, cfg.train.local_epochs) * cfg.train.rounds

    full = flops(sum(sizes))
    shard_samples = [sum(n for n, s in zip(sizes, shard_of) if s == k) for k in range(shards)]
    client_request = [flops(shard_samples[shard_of[c]] - sizes[c]) / full for c in range(len(sizes))]
    sample_request = [flops(shard_samples[shard_of[c]]) / full for c in range(len(sizes))]
    return {"scenario": scenario, "shards": shards, "seed": params.seed, "vectorised": vectorised, "rounds": cfg.train.rounds,
            "test_acc": acc, **weighing, "train_seconds": seconds, "train_cpu_seconds": cpu,
            "train_flops": None if trained is None else trained.cost.flops, "full_retrain_flops": full, "shard_samples": shard_samples,
            "assignment": list(shard_of), "client_samples": sizes,
            "client_request_flops_ratio": client_request, "sample_request_flops_ratio": sample_request}


def row(result: dict) -> str:
    client, sample = np.array(result["client_request_flops_ratio"]), np.array(result["sample_request_flops_ratio"])
    after = result.get("client_request")
    shown = f"{result['test_acc']:.4f} (equal weights {result.get('test_acc_equal_weights', float('nan')):.4f})" + (
        f"; after client {after['client']}: {after['test_acc']:.4f} (equal {after['test_acc_equal_weights']:.4f})"
        if after else "")
    return (f"| {result['shards']} | {result['seed']} | {shown} | {result['train_seconds']:.0f} "
            f"({result['train_cpu_seconds']:.0f} CPU) | "
            f"{client.mean():.3f} (max {client.max():.3f}) | {sample.mean():.3f} (max {sample.max():.3f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 5, 10])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--flops-only", action="store_true", help="the FLOPs columns alone: nothing trained")
    parser.add_argument("--vectorised", action="store_true", help="the shards trained stacked (torch.func.vmap)")
    parser.add_argument("--rounds", type=int, help="rounds instead of the scenario's (a timing, not a model to serve)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: the scenario's)")
    parser.add_argument("--client-request", type=int, metavar="CLIENT",
                        help="also forget this client exactly (its shard retrained) and score the ensemble after")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                        help="train each K once per seed (instead of params.yaml's seed): the spread a seed makes")
    args = parser.parse_args()
    params = load_params(args.root / "params.yaml")
    results = []
    print("| K | seed | test acc | train s | client request / full retrain FLOPs | sample request / full retrain FLOPs |")
    with intra_op_threads(args.threads or params.scenario(args.scenario).threads):
        for shards, seed in [(k, s) for k in args.shards for s in args.seeds or [None]]:
            results.append(measure(args.root, args.scenario, shards, args.flops_only, args.vectorised, args.rounds,
                                   args.client_request, seed))
            print(row(results[-1]), flush=True)
            args.out.write_text(json.dumps({"machine": platform.platform(), "threads": torch.get_num_threads(),
                                            "results": results}, indent=2))


if __name__ == "__main__":
    main()

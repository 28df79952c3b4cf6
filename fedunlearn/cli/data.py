"""``fedunlearn prepare`` and ``fedunlearn ids``."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_SCENARIO = "mnist5k-hfl"


def register(sub: argparse._SubParsersAction) -> None:
    prepare = sub.add_parser("prepare", help="prepare, partition and validate a scenario's data (DVC + GX)",
                             description="Run the DVC stages prepare → partition for the scenario(s), validate "
                                         "every partition with Great Expectations and print the data version.")
    prepare.add_argument("--scenario", action="append", help=f"scenario name (repeatable; default {DEFAULT_SCENARIO})")
    prepare.set_defaults(handler=run_prepare)

    ids = sub.add_parser("ids", help="print the sample IDs of the current data version, one per line",
                         description="Print training-sample IDs of the scenario's current data version — what "
                                     "a deletion request names.")
    ids.add_argument("--scenario", default=DEFAULT_SCENARIO)
    ids.add_argument("--client", type=int, help="only this client's samples (HFL/DFL)")
    ids.add_argument("--limit", type=int, help="print at most N IDs")
    ids.set_defaults(handler=run_ids)


def run_prepare(args: argparse.Namespace, root: Path) -> int:
    from tasks import validation, workspace

    workspace.init_workspace(root)
    for scenario in args.scenario or [DEFAULT_SCENARIO]:
        print(f"[{scenario}] DVC stages prepare -> partition@{scenario} ...", flush=True)
        version = workspace.reproduce(root, scenario)
        report = validation.validate_partition(scenario, root)
        print(f"[{scenario}] data version {version}: {report['samples']} samples in {report['splits']} splits, "
              f"{report['expectations']} expectations passed")
    return 0


def run_ids(args: argparse.Namespace, root: Path) -> int:
    import numpy as np

    from fedunlearn.data.store import PARTITIONS_DIR, read_manifest

    manifest = read_manifest(args.scenario, root)
    base = root / PARTITIONS_DIR / args.scenario
    if manifest["setting"] == "vfl":
        if args.client is not None:
            raise ValueError("--client applies to HFL/DFL scenarios; VFL parties share the same sample IDs")
        directories = [base / "party_000"]
    else:
        known = [c["client"] for c in manifest["clients"]]
        if args.client is not None and args.client not in known:
            raise ValueError(f"unknown client {args.client} in {args.scenario}; clients are {known[0]}..{known[-1]}")
        directories = [base / f"client_{c:03d}" for c in known if args.client in (None, c)]
    ids = np.concatenate([np.load(d / "sample_ids.npy") for d in directories])
    if args.limit is not None:
        ids = ids[:max(args.limit, 0)]
    print("\n".join(ids.tolist()))
    return 0

"""``fedunlearn init``, ``fedunlearn prepare`` and ``fedunlearn ids``."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.common import DEFAULT_SCENARIO, require_scenario


def register(sub: argparse._SubParsersAction) -> None:
    init = sub.add_parser("init", help="create a workspace: params.yaml, dvc.yaml, a DVC repository, the folders",
                          description="Make DIR a workspace (default: --root): copy params.yaml and dvc.yaml from the "
                                      "project, `dvc init --no-scm`, and create the ledger, the request folders and "
                                      "the MLflow store. An existing workspace keeps its files.")
    init.add_argument("directory", nargs="?", metavar="DIR", help="the workspace to create (default: --root)")
    init.set_defaults(handler=run_init, needs_workspace=False)

    prepare = sub.add_parser("prepare", help="prepare, partition and validate a scenario's data (DVC + GX)",
                             description="Run the DVC stages prepare → partition for the scenario(s), validate "
                                         "every partition with Great Expectations and print the data version.")
    prepare.add_argument("--scenario", action="append", help=f"scenario name (repeatable; default {DEFAULT_SCENARIO})")
    prepare.set_defaults(handler=run_prepare)

    ids = sub.add_parser("ids", help="print the sample IDs of the current data version, one per line",
                         description="Print training-sample IDs of the scenario's current data version — what "
                                     "a deletion request names.")
    ids.add_argument("--scenario", default=DEFAULT_SCENARIO, help="the scenario whose sample IDs to list (default "
                     "%(default)s)")
    ids.add_argument("--client", type=int, help="only this client's samples (HFL/DFL)")
    ids.add_argument("--limit", type=int, help="print at most N IDs")
    ids.set_defaults(handler=run_ids)

    check = sub.add_parser("check-data", help="what a scenario's data looks like to the pipeline, and its training time",
                           description="Read the scenario's dataset from its source, split as prepare and partition "
                                       "split it, and print its rows, classes, held-out split, samples per client, "
                                       "ID column, duplicate feature rows and outliers (robust z-score of the "
                                       "distance to the class centre), and an estimate of the training's compute "
                                       "time on this machine. Changes nothing.")
    check.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"the scenario whose data to look at (default {DEFAULT_SCENARIO})")
    check.set_defaults(handler=run_check_data)


def run_init(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.requests.folders import RequestFolders
    from stores.workspace import init_workspace

    workspace = init_workspace(Path(args.directory).resolve() if args.directory else root)
    RequestFolders.create(workspace)
    print(f"workspace {workspace}: params.yaml, dvc.yaml, .dvc/, data/ledger/ledger.jsonl, data/deletion_requests/, "
          f"mlflow/ (what lives where: data/README.md in the project); next: "
          f"`fedunlearn --root {workspace} train --scenario {DEFAULT_SCENARIO}`")
    return 0


def run_prepare(args: argparse.Namespace, root: Path) -> int:
    for scenario in args.scenario or [DEFAULT_SCENARIO]:
        require_scenario(root, scenario)  # every one before any work
    from stores import validation, workspace

    workspace.init_workspace(root)
    for scenario in args.scenario or [DEFAULT_SCENARIO]:
        print(f"[{scenario}] DVC stages prepare -> partition@{scenario} ...", flush=True)
        version = workspace.reproduce(root, scenario)
        report = validation.validate_partition(scenario, root)
        print(f"[{scenario}] data version {version}: {report['samples']} samples in {report['splits']} splits, "
              f"{report['expectations']} expectations passed")
    return 0


def sample_ids(root: Path, scenario: str, client: int | None = None) -> list[str]:
    """Training-sample IDs of the scenario's current data version (every party's in VFL)."""
    import numpy as np

    from fedunlearn.data.store import PARTITIONS_DIR, read_manifest

    manifest = read_manifest(scenario, root)
    base = root / PARTITIONS_DIR / scenario
    if manifest["setting"] == "vfl":
        if client is not None:
            raise ValueError("--client applies to HFL/DFL scenarios; VFL parties share the same sample IDs")
        directories = [base / "party_000"]
    else:
        known = [c["client"] for c in manifest["clients"]]
        if client is not None and client not in known:
            raise ValueError(f"unknown client {client} in {scenario}; clients are {known[0]}..{known[-1]}")
        directories = [base / f"client_{c:03d}" for c in known if client in (None, c)]
    return np.concatenate([np.load(d / "sample_ids.npy") for d in directories]).tolist()


def run_ids(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)
    ids = sample_ids(root, args.scenario, args.client)
    print("\n".join(ids[:max(args.limit, 0)] if args.limit is not None else ids))
    return 0


def run_check_data(args: argparse.Namespace, root: Path) -> int:
    require_scenario(root, args.scenario)
    from fedunlearn.config import load_params
    from fedunlearn.data_check import check_data

    for line in check_data(load_params(root / "params.yaml"), args.scenario, root).lines():
        print(line)
    return 0

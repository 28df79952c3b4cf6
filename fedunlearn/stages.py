"""Entry points of the DVC stages in ``dvc.yaml`` (run from the workspace root)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedunlearn.config import load_params
from fedunlearn.data.store import partition_scenario, prepare_dataset
from fedunlearn.requests.ledger import LEDGER_PATH, read_deleted_ids


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedunlearn.stages")
    parser.add_argument("stage", choices=["prepare", "partition"])
    parser.add_argument("name", help="dataset (prepare) or scenario (partition)")
    args = parser.parse_args(argv)
    root = Path.cwd()
    params = load_params(root / "params.yaml")
    if args.stage == "prepare":
        out = prepare_dataset(args.name, params, root, read_deleted_ids(root / LEDGER_PATH))
    else:
        out = partition_scenario(args.name, params, root)
    print(f"{args.stage} {args.name} -> {out.relative_to(root)}")


if __name__ == "__main__":
    main()

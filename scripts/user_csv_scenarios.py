"""Scenarios of undeclared memorisation, as a user's own CSV brings them: scikit-learn's digits
written to a CSV with an ID column, and either 8 % of its rows given a wrong label (``mislabel``) or
4 % extra out-of-distribution rows with random labels, half uniform noise and half inverted digits
(``ood``). Nothing in the workspace says which rows they are: the list goes to a file beside the CSV
(``<kind>.planted.json``) that only benchmarks read, as their ground truth.

    .venv/bin/fedunlearn init /tmp/umem
    .venv/bin/python scripts/user_csv_scenarios.py --root /tmp/umem --kind mislabel
    .venv/bin/fedunlearn --root /tmp/umem prepare --scenario user-mislabel-hfl

declares ``datasets: user-mislabel`` (``source: csv``) and the scenario ``user-mislabel-hfl`` (an MLP
on 3 IID clients, 20 rounds × 5 local epochs, as ``digits-canary-hfl``, at lr 0.01: the CSV's
standardised pixel columns diverge at 0.05) in the workspace's params.yaml.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

KINDS = ("mislabel", "ood")


def user_rows(kind: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Features in [0, 1], labels, IDs (``pat-NNNNN``) and the planted rows' IDs."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.data.astype(float) / 16.0, digits.target.copy()
    ids = np.array([f"pat-{i:05d}" for i in range(len(y))])
    rng = np.random.default_rng(seed)
    if kind == "mislabel":
        planted = rng.random(len(y)) < 0.08
        y[planted] = (y[planted] + rng.integers(1, 10, int(planted.sum()))) % 10
        return x, y, ids, ids[planted].tolist()
    count = 2 * int(0.02 * len(y))
    inverted = 1.0 - x[rng.choice(len(y), count // 2, replace=False)]
    extra = np.vstack([rng.uniform(0.0, 1.0, (count - count // 2, x.shape[1])), inverted])
    extra_ids = np.array([f"pat-{len(y) + i:05d}" for i in range(count)])
    return (np.vstack([x, extra]), np.concatenate([y, rng.integers(0, 10, count)]),
            np.concatenate([ids, extra_ids]), extra_ids.tolist())


def declare(root: Path, kind: str, csv: Path) -> str:
    """The dataset and its scenario added to ``root``'s params.yaml; the scenario's name."""
    path = root / "params.yaml"
    params = yaml.safe_load(path.read_text())
    name, scenario = f"user-{kind}", f"user-{kind}-hfl"
    params.setdefault("datasets", {})[name] = {"source": "csv", "path": str(csv.resolve()),
                                                "label_column": "label", "id_column": "id"}
    params["scenarios"][scenario] = {
        "dataset": name, "setting": "hfl", "model": "mlp",
        "partition": {"scheme": "iid", "num_clients": 3, "test_fraction": 0.3},
        "train": {"rounds": 20, "local_epochs": 5, "lr": 0.01, "momentum": 0.9, "batch_size": 16},
        "threads": 1}
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, type=Path, help="a workspace (fedunlearn init)")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--seed", type=int, default=7, help="which rows are planted")
    parser.add_argument("--data", type=Path, help="where the CSV goes (default: <root>/user); outside the workspace, "
                        "the CSV is the user's system of record and no batch rewrites it")
    args = parser.parse_args()
    import pandas as pd

    x, y, ids, planted = user_rows(args.kind, args.seed)
    folder = args.data or args.root / "user"
    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(x, columns=[f"px{i}" for i in range(x.shape[1])])
    frame.insert(0, "id", ids)
    frame["label"] = y
    csv = folder / f"{args.kind}.csv"
    frame.to_csv(csv, index=False)
    (folder / f"{args.kind}.planted.json").write_text(json.dumps(planted))
    scenario = declare(args.root, args.kind, csv)
    print(f"{csv}: {len(frame)} rows, {len(planted)} planted; scenario {scenario}")


if __name__ == "__main__":
    main()

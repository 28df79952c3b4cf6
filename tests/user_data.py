"""A user's own data written into a workspace, as a new user would declare it: a CSV of sklearn digits
with an ID column ``pat-NNNNN`` and an image folder of digits, both under ``data/user/`` and declared
in params.yaml with paths relative to the workspace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

CSV_PATH = "data/user/digits.csv"
IMAGES_PATH = "data/user/digit-images"


def write_csv(root: Path, rows: int = 240) -> Path:
    from sklearn.datasets import load_digits

    digits = load_digits()
    path = root / CSV_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["pid," + ",".join(f"px{i}" for i in range(64)) + ",label"]
    lines += [f"pat-{i:05d}," + ",".join(str(int(v)) for v in digits.data[i]) + f",{digits.target[i]}"
              for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_images(root: Path, per_class: int = 30, classes: int = 3) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    folder = root / IMAGES_PATH
    for label in range(classes):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        for k, index in enumerate(np.flatnonzero(digits.target == label)[:per_class]):
            pixels = (digits.images[index] * 255 / 16).astype(np.uint8)
            Image.fromarray(pixels).resize((8, 8)).save(folder / str(label) / f"img{k:03d}.png")
    return folder


def declare(root: Path, name: str, spec: dict, scenario: str, model: str = "mlp", rounds: int = 5,
            lr: float = 0.05) -> None:
    """``datasets.<name>`` = ``spec``, the dataset prepared, and an HFL scenario on it."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["datasets"] = {**(params.get("datasets") or {}), name: spec}
    params["prepare"] = [*params["prepare"], name]
    params["scenarios"][scenario] = {
        "dataset": name, "setting": "hfl", "model": model, "threads": 1,
        "partition": {"scheme": "iid", "num_clients": 3, "test_fraction": 0.3},
        "train": {"rounds": rounds, "local_epochs": 2, "lr": lr, "batch_size": 16}}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def csv_spec(system_of_record: bool = False) -> dict:
    return {"source": "csv", "path": CSV_PATH, "label_column": "label", "id_column": "pid",
            "system_of_record": system_of_record}


def images_spec(system_of_record: bool = False) -> dict:
    return {"source": "image_folder", "path": IMAGES_PATH, "size": 8, "system_of_record": system_of_record}

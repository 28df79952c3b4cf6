"""The workspace: a directory holding params.yaml, dvc.yaml, data/ (DVC) and mlflow/
(data/README.md lists what lives where).

``Workspace`` is what flows and tasks are handed: the layout, the params loaded once, the request
folders and ledger, one MLflow client. The DVC operations below are plain functions (no Prefect)
so the CLI, flows and tests share them. The project root is the default workspace; tests use a
fresh temporary one each.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from fedunlearn import lifeline
from fedunlearn.config import Params, ScenarioConfig, load_params
from fedunlearn.data.store import PARTITIONS_DIR, RAW_DIR, partition_scenario, prepare_dataset
from fedunlearn.errors import LOW_SPACE_BYTES, NoSpace, StateDamaged, watch_filesystems
from fedunlearn.requests.folders import RequestFolders, batch_lock
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger, read_deleted_ids
from stores.registry import Registry
from stores.erasure import CACHE_DIR, TEMPORARY_DIR
from fedunlearn.timing import CORE
from fedunlearn.transparency.log import init_key

PROJECT_ROOT = Path(__file__).resolve().parent.parent
WORKSPACE_FILES = ("params.yaml", "dvc.yaml")


class DvcError(RuntimeError):
    """A DVC command failed; the message carries DVC's own output."""


class DataVersionGone(StateDamaged):
    """An earlier data version is no longer in the DVC cache."""


def init_workspace(root: Path, template: Path = PROJECT_ROOT) -> Path:
    """Make ``root`` a workspace: copy params/dvc.yaml if absent, ``dvc init`` if needed,
    create the ledger (a DVC dependency) and the MLflow store directory."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    for name in WORKSPACE_FILES:
        if not (root / name).exists():
            shutil.copy(template / name, root / name)
    if not (root / ".dvc").is_dir():
        run_dvc(root, ["init", "--no-scm", "-q"])
    (root / LEDGER_PATH).parent.mkdir(parents=True, exist_ok=True)
    if not (root / LEDGER_PATH).exists():  # touching an existing ledger would move its mtime: DVC re-hashes it
        (root / LEDGER_PATH).touch()
    (root / "mlflow").mkdir(exist_ok=True)
    temporary_dir(root)
    init_key(root)  # the Merkle log's signing key, outside every store that is pushed (fedunlearn.transparency)
    return root


def temporary_dir(root: Path) -> Path:
    """The workspace's own temporary directory (the CLI's TMPDIR): temporary files stay where the
    erasure scan looks, and on the workspace's filesystem."""
    path = Path(root) / TEMPORARY_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


def _env() -> dict[str, str]:
    """Stage commands call ``python``: make it this interpreter, activated venv or not."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


# Below this much free space (``LOW_SPACE_BYTES``) a failing DVC command is reported as a full disk: DVC's
# own message for ENOSPC is often nothing at all.


def _dvc_failed(root: Path, args: list[str], output: str, status: str) -> Exception:
    free = shutil.disk_usage(root).free
    if "no space left on device" in output.lower() or free < LOW_SPACE_BYTES:
        return NoSpace(f"no space left on device ({root}: {free // 2**20} MiB free) while running `dvc "
                       f"{' '.join(args)}`; free space on that filesystem, then run the same command again: the "
                       "batch resumes where it stopped")
    return DvcError(f"`dvc {' '.join(args)}` failed in {root} ({status}): {output or 'DVC printed nothing'}")


def run_dvc(root: Path, args: list[str]) -> str:
    """``dvc <args>`` in a ``dvc`` process in the workspace: its standard output; a failure raised as
    ``DvcError`` with DVC's own output, or as ``NoSpace`` when the filesystem is full."""
    proc = subprocess.run(lifeline.command([sys.executable, "-m", "dvc", *args]), cwd=root, env=_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise _dvc_failed(root, args, (proc.stdout + proc.stderr).strip(), f"exit status {proc.returncode}")
    return proc.stdout


# DVC's Python API resolves paths (its stage cache's "dvc.yaml") against the process-wide working directory.
_IN_WORKSPACE = threading.Lock()


def _commit_stages(root: Path, scenario: str) -> None:
    """``dvc commit -f --with-deps partition@<scenario>``."""
    commit_stage(root, f"partition@{scenario}")


def commit_stage(root: Path, stage: str) -> None:
    """``dvc commit -f --with-deps <stage>`` through DVC's Python API (``Repo.commit``), in this process
    (the same dvc.lock bytes as a ``dvc`` process: tested). The working directory is the repository
    for the call only."""
    # In process rather than `dvc commit`: a `dvc` process pays an interpreter start and DVC's imports each time.
    from dvc.repo import Repo

    args = ["commit", "-f", "--with-deps", stage]
    dvc_logger = logging.getLogger("dvc")
    quiet = dvc_logger.level
    dvc_logger.setLevel(logging.ERROR)  # e.g. "the ledger is empty": expected before the first deletion
    try:
        with _IN_WORKSPACE, contextlib.chdir(root), Repo(str(root)) as repo:
            repo.commit(args[-1], with_deps=True, force=True)
    except Exception as err:
        raise _dvc_failed(root, args, str(err), type(err).__name__) from err
    finally:
        dvc_logger.setLevel(quiet)


def reproduce(root: Path, scenario: str) -> str:
    """What ``dvc repro partition@<scenario>`` does (its prepare stage included), with the stages run
    in this process; returns the data version. The stage functions are the commands in dvc.yaml
    (``python -m fedunlearn.stages``), so ``dvc repro`` from a shell writes the same bytes. ``dvc
    commit`` then hashes the outputs into dvc.lock and the cache, as ``dvc repro`` would: ``dvc
    status`` is clean. A command reproduces once, where its flow starts, and hands the data version
    down: nothing below asks for it again."""
    # Kept rather than `dvc repro`: DVC runs each stage's command in a new interpreter.
    root = Path(root).resolve()
    params = load_params(root / "params.yaml")
    dataset = params.scenario(scenario).dataset
    with CORE.measure():  # the new data version is the core library's work; DVC's bookkeeping is not
        gone = read_deleted_ids(root / LEDGER_PATH)
        prepare_dataset(dataset, params, root, gone)
        partition_scenario(scenario, params, root)
    _commit_stages(root, scenario)
    return data_version(root, scenario)


def data_version(root: Path, scenario: str) -> str:
    """The DVC content hash of the scenario's partition outputs (from dvc.lock)."""
    # Kept rather than DVC's API: dvc.lock is DVC's documented record of the hashes; no repository to open.
    lock = Path(root) / "dvc.lock"
    stage = f"partition@{scenario}"
    if lock.is_file():
        stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
        for out in stages.get(stage, {}).get("outs", []):
            if out["path"] == (PARTITIONS_DIR / scenario).as_posix():
                return out["md5"].removesuffix(".dir")
    raise FileNotFoundError(f"no data version for {scenario!r}: run `fedunlearn prepare --scenario {scenario}`")


def garbage_collect(root: Path, cloud: bool = False) -> str:
    """Remove cache objects not used by the current workspace (earlier data versions); with
    ``cloud``, from the default remote too."""
    return run_dvc(root, ["gc", "--workspace", "--force", *(["--cloud"] if cloud else [])])


def _object_db(root: Path):
    """DVC's local object database of the workspace (``.dvc/cache``, or the configured ``cache.dir``)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return repo.cache.local


def cached(root: Path, data_version: str) -> bool:
    """Whether the DVC cache still holds the data version (not purged)."""
    return _object_db(root).exists(f"{data_version}.dir")


def checkout_from_cache(root: Path, scenario: str, data_version: str, into: Path) -> None:
    """Link the files of an earlier data version from DVC's cache under ``into``, as DVC's object
    database lists the directory and places each object. Nothing is copied."""
    # Kept rather than `dvc checkout` of a pin file: it links by the cache type, by default a copy.
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    odb = _object_db(root)
    if not odb.exists(f"{data_version}.dir"):
        raise DataVersionGone(f"data version {data_version} of {scenario} is no longer in the DVC cache "
                              f"({odb.path}; purged by `ingest --purge`?): the deleted samples cannot be "
                              "read back to unlearn them; register a model on the current data version with "
                              f"`fedunlearn retrain --scenario {scenario}`, then run the command again")
    for key, _, entry in Tree.load(odb, HashInfo("md5", f"{data_version}.dir")):
        target = into / PARTITIONS_DIR / scenario / Path(*key)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(odb.oid_to_path(entry.value))


def sample_ids(root: Path, dataset: str, scenarios: list[str]) -> set[str]:
    """Every sample ID the workspace's current data holds: the prepared dataset and the scenarios'
    partitions (each split's ``sample_ids.npy``)."""
    found: set[str] = set()
    directories = [Path(root) / RAW_DIR / dataset] + [Path(root) / PARTITIONS_DIR / s for s in scenarios]
    for directory in directories:
        for path in directory.rglob("sample_ids.npy") if directory.is_dir() else []:
            found.update(np.load(path, allow_pickle=False).tolist())
    return found


class Workspace:
    """One workspace, opened once per flow or command: its layout, ``params.yaml`` loaded once, the
    request folders and ledger, and one MLflow client built with the workspace's URIs."""

    def __init__(self, root: Path, params: Params):
        self.root, self.params = Path(root).resolve(), params
        self._registry: Registry | None = None

    @classmethod
    def open(cls, root: str | Path) -> "Workspace":
        """``root`` made a workspace if it is not one yet (``init_workspace``), its params loaded."""
        root = init_workspace(Path(root))
        watch_filesystems(root)  # a full disk that does not say so is confirmed against the workspace's filesystem
        return cls(root, load_params(root / "params.yaml"))

    def scenario(self, name: str) -> ScenarioConfig:
        return self.params.scenario(name)

    def with_scenario(self, name: str, config: ScenarioConfig) -> "Workspace":
        """This workspace as a command sees it with ``name`` configured as ``config`` (its overrides,
        e.g. ``--rounds``): a new value sharing the registry; params.yaml and this value unchanged."""
        changed = Workspace(self.root, self.params.model_copy(update={"scenarios": {**self.params.scenarios,
                                                                                   name: config}}))
        changed._registry = self._registry
        return changed

    @property
    def folders(self) -> RequestFolders:
        return RequestFolders.create(self.root)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.root / LEDGER_PATH)

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = Registry(self.root)
        return self._registry

    @property
    def temporary_dir(self) -> Path:
        return temporary_dir(self.root)

    @property
    def cache_dir(self) -> Path:
        return self.root / CACHE_DIR

    def data_version(self, scenario: str) -> str:
        return data_version(self.root, scenario)

    def reproduce(self, scenario: str) -> str:
        return reproduce(self.root, scenario)

    def batch_lock(self, timeout: float, rerun: str):
        return batch_lock(self.folders, timeout, rerun)

    def relative(self, path: Path) -> str:
        """``path`` relative to the workspace; a symbolic link is not resolved (a quarantined link
        stays where it is, whatever it points at)."""
        return Path(os.path.abspath(path)).relative_to(self.root).as_posix()


@dataclass(frozen=True)
class ScenarioScope:
    """One scenario of one opened workspace, as the stages of a command share it: the workspace, the
    scenario's name and its configuration (params.yaml as the workspace loaded it). Built where a
    flow starts — an unknown name stops there — and the stages take it rather than a name to look up
    again."""

    ws: Workspace
    scenario: str
    config: ScenarioConfig = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", self.ws.scenario(self.scenario))  # frozen: set once, here

    def with_training(self, rounds: int | None = None, local_epochs: int | None = None) -> "ScenarioScope":
        """The scope with the command's training overrides (empty: the scenario's own)."""
        overrides = {k: v for k, v in {"rounds": rounds, "local_epochs": local_epochs}.items() if v is not None}
        if not overrides:
            return self
        config = self.config.model_copy(update={"train": self.config.train.model_copy(update=overrides)})
        return ScenarioScope(self.ws.with_scenario(self.scenario, config), self.scenario)

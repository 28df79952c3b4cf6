"""Durable stores: the workspace pushed to its DVC remote, and a workspace restored from it.

The DVC remote is DVC's own setting (``dvc remote add -d NAME URL``); the MLflow tracking server is
``mlflow.tracking_uri`` in params.yaml (``stores.registry``). With a default DVC remote, a deletion
batch pushes — before alias ``current`` moves, and again once its receipt is written — the data
versions of dvc.lock (``dvc push``, content-addressed under ``files/md5/``), then a snapshot
``fedunlearn-state/<time>-<sha256>.tar`` of what DVC's objects cannot say: params.yaml, dvc.yaml,
dvc.lock (which data version is current), .dvc/config, the ledger, the batch records (the journals
a re-run resumes from), the processed request files and the receipts — sample IDs and request
metadata, never a row. Its name carries the SHA-256 of its bytes.

Why: a lost ledger un-deletes. So data go first and the remote never holds a snapshot whose data it
lacks; a snapshot is moved into place whole (the newest ``KEEP_SNAPSHOTS`` kept), pushed only when
it differs from the last one pushed (``PUSHED_MARKER``), and never over a remote whose newest
snapshot holds ledger entries this workspace lacks — a workspace behind the remote would un-delete
what the remote recorded. Restore (``fedunlearn restore``) takes the newest snapshot, checks its
SHA-256, pulls the current data versions and verifies the ledger's hash chain against the batch
records and the registry against the receipts; the next ``fedunlearn process`` continues exactly
once. The steps, the limits (requests still in the inbox are in no snapshot) and the erasure scan
of a remote: docs/stores-and-recovery.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import yaml

from fedunlearn.errors import BatchFailed, FedunlearnError, InputError, StateDamaged
from fedunlearn.receipts import RECEIPTS_DIR, Receipt, parse_receipt
from fedunlearn.requests.folders import REQUESTS_DIR, RequestFolders
from fedunlearn.requests.integrity import check_ledger
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
from fedunlearn.transparency.log import LOG_DIR
from stores import erasure
from stores.workspace import DvcError, init_workspace, run_dvc

STATE_DIR = "fedunlearn-state"
KEEP_SNAPSHOTS = 3
PUSHED_MARKER = Path(".dvc/tmp/fedunlearn-state-pushed")
DEFAULT_REMOTE = "storage"
STATE_FILES = ("params.yaml", "dvc.yaml", "dvc.lock", ".dvc/config", LEDGER_PATH.as_posix())
# Folders whose regular files (one level) are state: journals, applied request files, receipts.
STATE_FOLDERS = ((REQUESTS_DIR / "batches").as_posix(), (REQUESTS_DIR / "processed").as_posix(),
                 Path(RECEIPTS_DIR).as_posix(), LOG_DIR.as_posix())  # LOG_DIR: the Merkle log, its heads, log.pub
SNAPSHOT_NAME = re.compile(r"^(?P<time>\d{8}T\d{12}Z)-(?P<digest>[0-9a-f]{64})\.tar$")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,200}$")


class RemoteUnavailable(BatchFailed):
    """The DVC remote could not be written or read; the batch stopped before alias ``current`` moved."""


class RemoteAhead(StateDamaged):
    """The remote's newest snapshot holds ledger entries this workspace lacks: pushing would drop them."""


@dataclass
class Snapshot:
    data: bytes
    digest: str
    files: list[str]

    def name(self, now: datetime | None = None) -> str:
        return f"{(now or datetime.now(timezone.utc)):%Y%m%dT%H%M%S%fZ}-{self.digest}.tar"


# --- the snapshot ----------------------------------------------------------------------------------

def state_files(root: Path) -> list[str]:
    """The workspace's state, relative paths: regular files only (a symbolic link is never followed)."""
    root = Path(root)
    found = [name for name in STATE_FILES if (root / name).is_file() and not (root / name).is_symlink()]
    for folder in STATE_FOLDERS:
        directory = root / folder
        if directory.is_dir():
            found += [f"{folder}/{p.name}" for p in sorted(directory.iterdir())
                      if p.is_file() and not p.is_symlink() and SAFE_NAME.match(p.name)]
    return found


def build_snapshot(root: Path) -> Snapshot:
    """The state as one tar, byte-identical for identical files (sorted, no times or owners)."""
    # Kept rather than `dvc push`: DVC pushes stage outputs; dvc.lock and the like belong in Git, absent here.
    root, buffer = Path(root), io.BytesIO()
    files = state_files(root)
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in files:
            data = (root / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return Snapshot(data, hashlib.sha256(data).hexdigest(), files)


def read_snapshot(data: bytes) -> dict[str, bytes]:
    """The files of a snapshot, each checked to be one the state consists of (nothing else is written)."""
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
        for member in archive.getmembers():
            name = member.name
            folder, _, base = name.rpartition("/")
            allowed = name in STATE_FILES or (folder in STATE_FOLDERS and SAFE_NAME.match(base))
            if not member.isfile() or not allowed:
                raise StateDamaged(f"the state snapshot holds {name!r}, which is not a file of a workspace's state; "
                                   "it was not written by `fedunlearn` — restore from a remote that `fedunlearn "
                                   "process` pushed to")
            files[name] = archive.extractfile(member).read()
    return files


# --- the remote --------------------------------------------------------------------------------------

@contextmanager
def remote_fs(root: Path) -> Iterator[tuple[object, str]]:
    """DVC's filesystem for the workspace's default remote, and the path of the snapshots on it."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        remote = repo.cloud.get_remote()
        yield remote.fs, remote.fs.join(remote.path, STATE_DIR)


def snapshot_names(fs, base: str) -> list[str]:
    """The snapshots on the remote, oldest first."""
    try:
        listed = fs.ls(base, detail=False)
    except FileNotFoundError:
        return []
    return sorted(name for name in (fs.name(path) for path in listed) if SNAPSHOT_NAME.match(name))


def fetch_snapshot(fs, base: str, name: str) -> bytes:
    data = fs.cat_file(fs.join(base, name))
    digest = SNAPSHOT_NAME.match(name)["digest"]
    if hashlib.sha256(data).hexdigest() != digest:
        raise StateDamaged(f"the state snapshot {base}/{name} does not read back as written (its SHA-256 is not the "
                           f"one in its name): it was changed or cut off on the remote. An older snapshot could "
                           f"lack deletions, so none is taken instead: repair the remote's copy")
    return data


def _ledger_keys(raw: bytes) -> list[str]:
    """Each entry's checksum (its request ID before entries were chained), in order."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.jsonl"
        path.write_bytes(raw)
        return [e.checksum or e.request_id for e in Ledger(path).inspect().entries]


def check_not_behind(root: Path, fs, base: str, names: list[str], url: str) -> None:
    """The newest snapshot's ledger is a prefix of this workspace's: nothing it recorded would be lost."""
    if not names:
        return
    remote_ledger = read_snapshot(fetch_snapshot(fs, base, names[-1])).get(LEDGER_PATH.as_posix(), b"")
    theirs = _ledger_keys(remote_ledger)
    ours = _ledger_keys((Path(root) / LEDGER_PATH).read_bytes()) if (Path(root) / LEDGER_PATH).is_file() else []
    if ours[:len(theirs)] != theirs:
        raise RemoteAhead(
            f"the DVC remote {url} holds a newer state than this workspace ({base}/{names[-1]}: {len(theirs)} ledger "
            f"entries, this workspace's {Path(root) / LEDGER_PATH} {len(ours)}, and they differ): pushing would drop "
            f"deletions the remote recorded. Restore the workspace from the remote (`fedunlearn --root NEW restore "
            f"--dvc-remote {url}`), or configure another remote for this workspace")


def _marker(root: Path) -> dict:
    path = Path(root) / PUSHED_MARKER
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_marker(root: Path, url: str, digest: str, name: str) -> None:
    path = Path(root) / PUSHED_MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"remote": url, "digest": digest, "snapshot": name}))


def locked_stages(root: Path) -> list[str]:
    """The stages dvc.lock records (``prepare@<dataset>``, ``partition@<scenario>``): the data versions."""
    # Read from dvc.lock, DVC's documented record (no repository to open): the stages the snapshot names.
    lock = Path(root) / "dvc.lock"
    if not lock.is_file():
        return []
    return sorted((yaml.safe_load(lock.read_text()) or {}).get("stages", {}))


def push_state(root: Path, force: bool = False) -> str | None:
    """Push the data versions of dvc.lock, then a state snapshot, to the default DVC remote. Returns
    the snapshot's name; None when there is no default remote, nothing prepared yet, or (unless
    ``force``) the same state was pushed to the same remote already."""
    root = Path(root)
    remote = erasure.dvc_remote(root)
    stages = locked_stages(root)
    if remote is None or not stages:
        return None
    name, url = remote
    snapshot = build_snapshot(root)
    marker = _marker(root)
    if not force and marker.get("remote") == url and marker.get("digest") == snapshot.digest:
        return None
    check = check_ledger(RequestFolders(root), Ledger(root / LEDGER_PATH))
    if not check.intact:  # a damaged ledger never becomes the remote's newest state
        raise StateDamaged("the ledger does not verify against the batch records, so it is not pushed to the DVC "
                           "remote:\n" + "\n".join(check.lines()))
    where = f"the DVC remote {name!r} ({url})"
    try:
        run_dvc(root, ["push", "-q", *stages])
        with remote_fs(root) as (fs, base):
            names = snapshot_names(fs, base)
            check_not_behind(root, fs, base, names, url)
            latest = names[-1] if names else None
            if latest is not None and SNAPSHOT_NAME.match(latest)["digest"] == snapshot.digest:
                target = latest  # the same state is there already
            else:
                target = snapshot.name()
                fs.makedirs(base, exist_ok=True)
                partial = fs.join(base, f".{target}.partial")
                fs.pipe_file(partial, snapshot.data)
                fs.mv(partial, fs.join(base, target))
                for old in [*names, target][:-KEEP_SNAPSHOTS]:
                    fs.rm_file(fs.join(base, old))
    except FedunlearnError:
        raise
    except Exception as err:  # DVC's errors, the remote filesystem's (OSError, a cloud SDK's own)
        raise RemoteUnavailable(f"pushing the data versions and the state to {where} failed: {err}. Make the remote "
                                "reachable, then run the same command again: a batch resumes and pushes before alias "
                                "`current` moves (`fedunlearn push` pushes by hand)") from err
    _write_marker(root, url, snapshot.digest, target)
    return target


def stale(root: Path) -> bool:
    """Whether a default remote is configured and does not hold this state yet (cheap: local files only)."""
    remote = erasure.dvc_remote(root)
    if remote is None or not locked_stages(root):
        return False
    marker = _marker(root)
    return marker.get("remote") != remote[1] or marker.get("digest") != build_snapshot(root).digest


# --- restore -------------------------------------------------------------------------------------------

@dataclass
class Restored:
    root: Path
    snapshot: str
    files: int
    stages: list[str]
    fetched_before: list[str]
    ledger_lines: list[str]
    tracking_uri: str
    registry_lines: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"restored {self.root} from the state snapshot {self.snapshot} ({self.files} files)",
                f"data versions pulled: {', '.join(self.stages) or 'none'}"
                + (f"; also the data before unfinished batches: {', '.join(self.fetched_before)}"
                   if self.fetched_before else ""),
                *self.ledger_lines, f"MLflow: {self.tracking_uri}", *self.registry_lines]


def _absolute_url(url: str) -> str:
    """A local remote's path made absolute (DVC would read a relative one from the workspace)."""
    return url if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", url) else str(Path(url).expanduser().resolve())


def set_tracking_uri(root: Path, uri: str) -> None:
    """``mlflow.tracking_uri`` in params.yaml, the rest of the file (comments included) as it was."""
    from fedunlearn.config import load_params

    path = Path(root) / "params.yaml"
    text = path.read_text()
    value = json.dumps(uri)
    block = re.compile(r"^(mlflow:[ \t]*\n(?:[ \t]+.*\n)*?[ \t]+tracking_uri:[ \t]*)[^\n#]*", re.M)
    if block.search(text):
        text = block.sub(lambda m: m.group(1) + value, text, count=1)
    elif re.search(r"^mlflow:", text, re.M):  # another form (flow style): rewritten, its comments lost
        document = yaml.safe_load(text) or {}
        document["mlflow"] = {**(document.get("mlflow") or {}), "tracking_uri": uri}
        text = yaml.safe_dump(document, sort_keys=False)
    else:
        text = text.rstrip("\n") + f"\n\nmlflow:\n  tracking_uri: {value}\n"
    path.write_text(text)
    if load_params(path).mlflow.tracking_uri != uri:
        raise InputError(f"{path}: could not set mlflow.tracking_uri to {uri}; set it by hand")


def _fetch_versions(root: Path, versions: dict[str, str]) -> list[str]:
    """Fetch earlier data versions (``scenario → DVC hash``) into the cache, by a .dvc file naming each
    (removed after: a leftover would keep them from `dvc gc`). Those the remote lacks are skipped."""
    # A temporary .dvc file per version: `dvc fetch` takes targets, not hashes.
    fetched = []
    with tempfile.TemporaryDirectory(prefix="restore-", dir=Path(root) / ".tmp") as tmp:
        for scenario, version in versions.items():
            pin = Path(tmp) / f"{scenario}-{version}.dvc"
            pin.write_text(yaml.safe_dump({"outs": [{"md5": f"{version}.dir", "path": f"before-{version}",
                                                      "hash": "md5"}]}))
            try:
                run_dvc(root, ["fetch", "-q", str(pin.relative_to(root))])
                fetched.append(f"{scenario}@{version[:10]}")
            except DvcError:
                pass  # not on the remote (purged): a resumed batch then says to retrain
    return fetched


def _check_registry(root: Path, receipts: list[Receipt]) -> list[str]:
    """Every model version the newest receipt of each scenario names is in the registry; where the
    aliases of each scenario's registered model point now."""
    from mlflow.exceptions import MlflowException

    from fedunlearn.config import load_params
    from stores.registry import Registry, is_tracking_server, retired_batch
    from stores.workspace import data_version

    registry = Registry(root)
    try:
        models = [m.name for m in registry.client.search_registered_models()]
    except Exception as err:  # MlflowException, connection errors
        raise InputError(f"the MLflow store {registry.uri} does not answer ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); start the tracking server, or pass the "
                         "right --mlflow-tracking-uri, then run `fedunlearn restore` again") from err
    if not models:
        own = "" if is_tracking_server(registry.uri) else " (the workspace's own store: no tracking server configured)"
        return [f"the MLflow registry {registry.uri}{own} holds no registered model: if the workspace used a tracking "
                "server, delete this directory and restore again with --mlflow-tracking-uri; otherwise register a model on "
                "the current data version with `fedunlearn retrain --scenario S` before the next batch"]
    newest: dict[str, Receipt] = {}
    for receipt in sorted(receipts, key=lambda r: r.created_at):
        newest[receipt.scenario] = receipt
    for scenario, receipt in sorted(newest.items()):
        for role, ref in receipt.models.items():
            if ref is None:
                continue
            try:
                found = registry.version(scenario, ref.version)
            except MlflowException as err:
                if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                found = None
            if found is None or (ref.run_id and found.run_id != ref.run_id):
                raise StateDamaged(f"receipt {RECEIPTS_DIR}/{receipt.batch_id}.json names {scenario} v{ref.version} "
                                   f"({role}, run {ref.run_id}), which the MLflow registry at {registry.uri} does "
                                   "not hold: is it this workspace's tracking server? Restore again with the right "
                                   "--mlflow-tracking-uri")
    lines = []
    for scenario in sorted(set(models) & set(load_params(root / "params.yaml").scenarios)):
        aliases = {alias: registry.alias_ref(scenario, alias) for alias in ("current", "retrained", "original")}
        try:
            on = data_version(root, scenario)
        except FileNotFoundError:
            on = None
        lines.append(f"{scenario}: " + ", ".join(
            f"alias {alias} -> v{ref.version} (data version {(ref.data_version or '?')[:10]}"
            f"{', the current one' if on and ref.data_version == on else ''})"
            for alias, ref in aliases.items() if ref is not None))
        # Retirement lives in the registry, not in the snapshot: an older snapshot brings no weights back.
        retired = [f"v{v.version} (by {retired_batch(v)})" for v in registry.versions(scenario) if retired_batch(v)]
        if retired:
            lines.append(f"{scenario}: retired, their weights gone and not restored: {', '.join(retired)}")
    return lines


def restore(root: Path, remote_url: str, tracking_uri: str | None = None) -> Restored:
    """A workspace in the empty directory ``root`` from the newest state snapshot on ``remote_url``
    (a DVC remote URL) and the MLflow tracking server (``tracking_uri``, or the one the snapshot's
    params.yaml names)."""
    root = Path(root).resolve()
    # Prefect's home (<root>/.prefect, made when Prefect is imported) is no workspace state.
    if root.exists() and (not root.is_dir() or any(p.name != ".prefect" for p in root.iterdir())):
        raise InputError(f"{root} is not an empty directory: restore into a new one (`fedunlearn --root NEW restore "
                         "...`); an existing workspace is never overwritten")
    url = _absolute_url(remote_url)
    try:
        return _restore(root, url, tracking_uri)
    except BaseException as err:
        # The directory held nothing before: what a failed restore wrote goes, and it can simply run again.
        for child in root.iterdir() if root.is_dir() else []:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        if isinstance(err, DvcError):
            raise InputError(f"restoring {root} from the DVC remote {url} failed: {err}. Check the URL and DVC's "
                             "credentials for it, then run `fedunlearn restore` again") from err
        raise


def _owed_versions(folders: RequestFolders, done: set[str]) -> dict[str, str]:
    """The data versions before the last batch of each scenario, when that batch has no receipt: a
    resumed batch unlearns from them."""
    from fedunlearn.requests.batch import load_records

    last = {}
    for record in load_records(folders):
        last[record.scenario] = record
    return {scenario: change.before for record in last.values() if record.batch_id not in done
            for scenario, change in record.data_versions.items() if change.before}


def _restore(root: Path, url: str, tracking_uri: str | None) -> Restored:
    root.mkdir(parents=True, exist_ok=True)
    run_dvc(root, ["init", "--no-scm", "-q"])
    run_dvc(root, ["remote", "add", "-d", DEFAULT_REMOTE, url])
    try:
        with remote_fs(root) as (fs, base):
            names = snapshot_names(fs, base)
            if not names:
                raise InputError(f"the DVC remote {url} holds no state snapshot ({base}/ is empty or missing): "
                                 "is it the remote a workspace's deletion batches pushed to (`dvc remote add -d` in "
                                 "that workspace)?")
            data = fetch_snapshot(fs, base, names[-1])
    except FedunlearnError:
        raise
    except Exception as err:  # DVC's and the remote filesystem's own errors
        raise InputError(f"the DVC remote {url} cannot be read ({type(err).__name__}: {err}); check the URL and "
                         "DVC's credentials for it, then run `fedunlearn restore` again") from err
    files = read_snapshot(data)
    for name, content in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    # The snapshot's .dvc/config names the remote as the old workspace reached it: this one reaches it at url.
    remote_name = (erasure.dvc_remote(root) or (DEFAULT_REMOTE, url))[0]
    run_dvc(root, ["remote", "add", "-d", "-f", remote_name, url])
    if tracking_uri:
        set_tracking_uri(root, tracking_uri)
    init_workspace(root)
    folders = RequestFolders.create(root)
    stages = locked_stages(root)
    if stages:
        run_dvc(root, ["pull", "-q", *stages])
    receipts = [parse_receipt(content, f"{name} (in the snapshot)") for name, content in files.items()
                if name.startswith(f"{Path(RECEIPTS_DIR).as_posix()}/")]
    owed = _owed_versions(folders, {r.batch_id for r in receipts})
    fetched = _fetch_versions(root, owed) if owed else []
    check = check_ledger(folders, Ledger(root / LEDGER_PATH))
    if not check.intact:
        raise StateDamaged("the restored ledger does not verify against the restored batch records:\n"
                           + "\n".join(check.lines()))
    _write_marker(root, url, hashlib.sha256(data).hexdigest(), names[-1])
    from stores.registry import tracking_uri as workspace_tracking_uri

    return Restored(root, names[-1], len(files), stages, fetched, check.lines(), workspace_tracking_uri(root),
                    _check_registry(root, receipts))

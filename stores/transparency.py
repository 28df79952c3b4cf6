"""The Merkle log's tree heads published beyond the workspace: after each batch
the signed head and the public key go to the DVC remote (``fedunlearn-state/transparency/``,
beside the state snapshots) and to MLflow (artifacts ``transparency/`` of the batch's run, or of a run of the
``transparency-log`` experiment), so that rewriting the log unseen means rewriting three stores.
Also the serving version's model hash the batch statement commits to.

Call ``publish_tree_head(root, run_id)`` once a batch's receipt is written (and after an exact
retrain repaid a batch): it logs what is not logged yet, signs, and publishes. ``published_heads``
reads every head back from both stores: the log signs nothing that does not extend each of them,
so a workspace whose ``data/transparency/`` was lost or rebuilt cannot sign a new
history under the old origin.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fedunlearn.transparency.backing import Backing, VersionView
from fedunlearn.transparency.log import LOG_DIR, ModelHash, TransparencyLog, all_receipts, backing_of, sync_workspace
from stores.registry.weights import tree_digest

REMOTE_DIR = "transparency"
EXPERIMENT = "transparency-log"
HEAD_TAG = "fedunlearn.tree_head_size"  # on every run a head was published to, so that they can be found again
HEAD_LIMIT = 64 << 10  # a published head is a signed note of a few lines; a larger file is not one


def weights_sha256(root: Path) -> ModelHash:
    """(scenario, version) -> the digest of the version's weights artifacts (``weights/``); None when
    they cannot be read (the leaf then says the hash is unknown rather than inventing one)."""
    from stores.registry import Registry
    from stores.registry.weights import WEIGHTS

    registry: list[Registry] = []
    known: dict[tuple[str, str], str | None] = {}  # read once per command: a version's weights do not change

    def digest(scenario: str, version: str) -> str | None:
        if (scenario, version) not in known:
            known[scenario, version] = read(scenario, version)
        return known[scenario, version]

    def read(scenario: str, version: str) -> str | None:
        try:
            if not registry:
                registry.append(Registry(root))
            found = registry[0].version(scenario, version)
            if found.tags.get("weights_sha256"):  # retired: its tombstone keeps the digest of the weights it had
                return found.tags["weights_sha256"]
            (Path(root) / ".tmp").mkdir(exist_ok=True)
            with tempfile.TemporaryDirectory(dir=Path(root) / ".tmp") as tmp:
                return tree_digest(Path(registry[0].client.download_artifacts(found.run_id, WEIGHTS, tmp)))
        except Exception:  # MLflow's errors, a missing artifact: the hash is unknown, the log still grows
            return None
    return digest


@dataclass
class Published:
    size: int
    places: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return ([f"tree head (size {self.size}) published to {place}" for place in self.places]
                + [f"tree head not published to {why}" for why in self.skipped])


def registry_view(root: Path) -> dict[tuple[str, str], VersionView]:
    """Every registered version of the workspace as its tags describe it (none without a store)."""
    from stores.registry.runs import Runs, tracking_uri

    uri = tracking_uri(root)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return {}
    views = {}
    for v in Runs(root).client.search_model_versions(""):
        tags = v.tags
        views[v.name, str(v.version)] = VersionView(
            v.name, str(v.version), tags.get("role"), tags.get("forgetting"), tags.get("certificate"),
            tags.get("retirement"), tags.get("retired_by"), tags.get("retired_at"), tags.get("weights_sha256"),
            tags.get("hold"), tags.get("hold_at"))
    return views


def workspace_backing(root: Path, model_hash: ModelHash | None = None) -> Backing:
    """What the log's leaves are checked against: the receipts, the batch records on file and the
    registry's versions (``fedunlearn.transparency.backing``)."""
    from fedunlearn.requests.folders import RequestFolders

    batches = RequestFolders(Path(root)).batches
    records = {p.name.removesuffix(".json") for p in batches.glob("*.json")} if batches.is_dir() else set()
    return backing_of(all_receipts(root), records, registry_view(Path(root)), model_hash or weights_sha256(root))


def signed_log(root: Path, model_hash: ModelHash | None = None) -> TransparencyLog:
    """The log synced and signed, every leaf checked against its record, every published head bound."""
    model_hash = model_hash or weights_sha256(root)
    return sync_workspace(root, model_hash, published_heads(root), workspace_backing(root, model_hash))


def publish_tree_head(root: Path, run_id: str | None = None) -> Published:
    """Sync and sign the log (once it extends every published head and every leaf is backed by
    its record), then copy its head and public key to the DVC remote and MLflow."""
    root = Path(root)
    log = signed_log(root)
    head = log.head() or ""
    size = int(head.split("\n")[1])
    published = Published(size)
    _to_dvc_remote(root, log, size, published)
    _to_mlflow(root, log, size, run_id, published)
    return published


def _to_dvc_remote(root: Path, log: TransparencyLog, size: int, published: Published) -> None:
    from stores.durable import remote_fs
    from stores.erasure import dvc_remote

    remote = dvc_remote(root)
    if remote is None:
        published.skipped.append("a DVC remote (none configured)")
        return
    with remote_fs(root) as (fs, base):
        target = fs.join(base, REMOTE_DIR)  # beside the state snapshots, which are listed by name pattern
        fs.makedirs(target, exist_ok=True)
        for name, text in ((f"head-{size}.checkpoint", log.head()), ("checkpoint", log.head()),
                           ("log.pub", (log.directory / "log.pub").read_text())):
            fs.pipe_file(fs.join(target, name), text.encode())
        published.places.append(f"the DVC remote {remote[0]!r} ({target})")


def _to_mlflow(root: Path, log: TransparencyLog, size: int, run_id: str | None, published: Published) -> None:
    from stores.registry import Registry

    registry = Registry(root)
    texts = {f"{REMOTE_DIR}/head-{size}.checkpoint": log.head(), f"{REMOTE_DIR}/log.pub":
             (log.directory / "log.pub").read_text()}
    if run_id is None:
        with registry.run(EXPERIMENT, f"head-{size}", {"tree_size": size}, {"log_dir": str(LOG_DIR)}) as run_id:
            for name, text in texts.items():
                registry.log_text(run_id, text, name)
    else:
        for name, text in texts.items():
            registry.log_text(run_id, text, name)
    registry.set_run_tag(run_id, HEAD_TAG, str(size))
    published.places.append(f"MLflow (run {run_id})")


def published_heads(root: Path) -> list[tuple[str, str]]:
    """(where, signed note) of every tree head published to the DVC remote and to MLflow. A store
    that is configured but cannot be read is an error: signing past heads nobody checked would
    defeat the check."""
    root = Path(root)
    try:
        return _heads_on_dvc_remote(root) + _heads_in_mlflow(root)
    except Exception as err:  # DVC's and MLflow's errors alike: one line, and nothing signed
        from fedunlearn.transparency.failures import LogRewritten

        raise LogRewritten(f"the published tree heads could not be read ({err.__class__.__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}); nothing was signed. Check the DVC "
                           "remote and the MLflow store, then run the command again") from None


def _heads_on_dvc_remote(root: Path) -> list[tuple[str, str]]:
    from stores.durable import remote_fs
    from stores.erasure import dvc_remote

    if dvc_remote(root) is None:
        return []
    found = []
    with remote_fs(root) as (fs, base):
        target = fs.join(base, REMOTE_DIR)
        try:
            names = sorted(fs.name(path) for path in fs.ls(target, detail=False))
        except FileNotFoundError:
            return []
        for name in names:
            if name == "checkpoint" or (name.startswith("head-") and name.endswith(".checkpoint")):
                data = fs.cat_file(fs.join(target, name), start=0, end=HEAD_LIMIT + 1)
                found.append((f"the DVC remote's {REMOTE_DIR}/{name}", data.decode("utf-8", "replace")))
    return found


def _heads_in_mlflow(root: Path) -> list[tuple[str, str]]:
    """Runs tagged ``HEAD_TAG``, and for heads published before the tag: the ``transparency-log``
    experiment's runs and those of the registered versions (a batch publishes to its version's run)."""
    from stores.registry.runs import Runs, tracking_uri

    uri = tracking_uri(root)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return []  # no store yet: nothing was published
    runs = Runs(root)
    experiments = [e.experiment_id for e in runs.client.search_experiments()]
    run_ids = {r.info.run_id for r in runs.client.search_runs(experiments, f"tags.`{HEAD_TAG}` != ''")}
    legacy = runs.client.get_experiment_by_name(EXPERIMENT)
    run_ids |= {r.info.run_id for r in runs.client.search_runs([legacy.experiment_id])} if legacy else set()
    run_ids |= {v.run_id for v in runs.client.search_model_versions("") if v.run_id}
    found = []
    (root / ".tmp").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root / ".tmp") as tmp:
        for run_id in sorted(run_ids):
            for artifact in runs.client.list_artifacts(run_id, REMOTE_DIR):
                name = artifact.path.rsplit("/", 1)[-1]
                if name.startswith("head-") and name.endswith(".checkpoint"):
                    path = Path(runs.client.download_artifacts(run_id, artifact.path, tmp))
                    with open(path, "rb") as handle:
                        text = handle.read(HEAD_LIMIT + 1).decode("utf-8", "replace")
                    found.append((f"MLflow run {run_id}'s {artifact.path}", text))
    return found


@dataclass
class Damage:
    """What ``workspace_damage`` found: each line names the file, the leaf or the entry, and its fix."""

    lines: list[str] = field(default_factory=list)
    ledger: bool = False  # the ledger itself is damaged (the log was then not checked against it)

    def __bool__(self) -> bool:
        return bool(self.lines)


def workspace_damage(root: Path) -> Damage:
    """The ledger against the batch records, the Merkle log against the ledger, its signed heads
    (on file and published) and every leaf against its record, the receipts read back. Reads only."""
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.integrity import check_ledger
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
    from fedunlearn.transparency.failures import LogRewritten
    from stores.registry import registered_batch_ids

    root, found = Path(root), Damage()
    ledger = check_ledger(RequestFolders(root), Ledger(root / LEDGER_PATH), lambda: registered_batch_ids(root))
    problems = ledger.problems()  # a torn tail only an unfinished append can have left is no damage
    if problems:  # the log is checked against an intact ledger only
        return Damage([f"ledger {LEDGER_PATH}: {problem} (`fedunlearn ledger repair` restores it)"
                       for problem in problems], ledger=True)
    try:
        published, backing = published_heads(root), workspace_backing(root)
    except LogRewritten as err:  # a receipt that does not read back, a published head that cannot be read
        return Damage(found.lines + [str(err)])
    check = TransparencyLog(root).check(ledger.inspection.entries, published, backing)
    found.lines += [f"Merkle log: {problem}" for problem in check.problems]
    return found


def refuse_if_damaged(root: Path, command: str, ledger_checked: bool = False) -> None:
    """Verify, then write: a command that signs or tags calls this first; on damage it raises
    ``LogRewritten`` (exit status 4) and nothing was written — no tag, no leaf, no head — so the
    evidence stays as it was found. ``ledger_checked``: the caller checks the ledger itself before
    it changes anything (a batch's intake, whose messages name the batch), so a damaged ledger is
    left to it."""
    from fedunlearn.transparency.failures import LogRewritten

    damage = workspace_damage(root)
    if damage and not (damage.ledger and ledger_checked):
        more = f" (and {len(damage.lines) - 1} more: `fedunlearn ledger verify`)" if len(damage.lines) > 1 else ""
        raise LogRewritten(f"{command} refused: {damage.lines[0]}{more}. Nothing was written: no tag, no leaf, no "
                           "tree head; the damaged files are as they were found")

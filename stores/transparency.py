"""The Merkle log's tree heads published beyond the workspace (issue 39, item 4): after each batch
the signed head and the public key go to the DVC remote (``fedunlearn-state/transparency/``,
beside the state snapshots) and to MLflow (artifacts ``transparency/`` of the batch's run, or of a run of the
``transparency-log`` experiment), so that rewriting the log unseen means rewriting three stores.
Also the serving version's model hash the batch statement commits to.

Call ``publish_tree_head(root, run_id)`` once a batch's receipt is written (and after an exact
retrain repaid a batch): it logs what is not logged yet, signs, and publishes. ``published_heads``
reads every head back from both stores: the log signs nothing that does not extend each of them
(issue 47), so a workspace whose ``data/transparency/`` was lost or rebuilt cannot sign a new
history under the old origin.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fedunlearn.transparency.log import LOG_DIR, ModelHash, TransparencyLog, sync_workspace
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

    def digest(scenario: str, version: str) -> str | None:
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


def publish_tree_head(root: Path, run_id: str | None = None) -> Published:
    """Sync and sign the log (once it extends every published head), then copy its head and
    public key to the DVC remote and MLflow."""
    root = Path(root)
    log = sync_workspace(root, weights_sha256(root), published_heads(root))
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

"""Typed parameters. ``params.yaml`` (DVC's params file) is the one source of defaults; these
pydantic models validate it and are what flows, the CLI and the Prefect UI forms use."""

from __future__ import annotations

import copy
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AllowInfNan, BaseModel, ConfigDict, Field, Strict, StringConstraints, ValidationError,
                      field_validator, model_validator)

from fedunlearn.config_errors import describe_validation
from fedunlearn.dataset_specs import DatasetSpec, with_workspace_paths
from fedunlearn.errors import InputError
from fedunlearn.params_yaml import YamlSyntax, load_bounded
from fedunlearn.user_files import read_capped

Setting = Literal["hfl", "vfl", "dfl"]

# Strict scalars: lax pydantic reads `shards: "3"` as 3 and `shards: true` as 1, silently. A float
# field still takes an integer (`lr: 1`); none takes a quoted number, a boolean, inf or nan.
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict(), AllowInfNan(False)]
Flag = Annotated[bool, Strict()]
Seed = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)]  # NumPy's legacy seeding takes 32 bits
# A scenario or dataset name becomes a folder, a file and a registered model's name: no '/', no
# leading '.' (the same rule as a request's scenario, fedunlearn.requests.model).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RULE = "1-64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
_NAME = re.compile(NAME_PATTERN)
# Upper bounds keep every later computation finite (a deadline of 1e308 days overflowed `status`)
# while staying far above any real setting.
MAX_DAYS = 3650
MAX_HOURS = MAX_DAYS * 24
MAX_ROUNDS = 1_000_000
MAX_EPOCHS = 100_000
MAX_BATCH_SIZE = 1 << 20
MAX_CLIENTS = 100_000
MAX_THREADS = 1024
MAX_COUNT = 1_000_000_000
MAX_REFERENCES = 4096


class ForgettingPolicy(str, Enum):
    """``interim``: an approximate version that fails no check serves, exact forgetting is scheduled
    before the deadlines; ``strict``: escalate until a version passes every check (an exact retrain
    at worst). ``certify.tiers`` holds the contract."""

    interim = "interim"
    strict = "strict"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrainConfig(_Strict):
    """Federated training hyperparameters (FedAvg as server SGD on pseudo-gradients)."""

    rounds: Int = Field(20, ge=1, le=MAX_ROUNDS, description="communication rounds")
    local_epochs: Int = Field(1, ge=1, le=MAX_EPOCHS, description="epochs each client trains per round")
    lr: Number = Field(0.05, gt=0, description="client SGD learning rate")
    batch_size: Int = Field(32, ge=1, le=MAX_BATCH_SIZE)
    momentum: Number = Field(0.0, ge=0, lt=1)
    client_fraction: Number = Field(1.0, gt=0, le=1, description="share of clients sampled per round")
    server_lr: Number = Field(1.0, gt=0, description="η_s: w ← w + η_s Σ_i (n_i/n)(w_i − w)")
    min_test_acc: Number = Field(0.0, ge=0, le=1, description="an original below this test accuracy is not "
                                 "registered (nor one no better than the majority class, nor one whose loss is NaN)")


class PartitionConfig(_Strict):
    """How the data is split (the DVC ``partition`` stage's parameters)."""

    scheme: Literal["iid", "dirichlet", "vertical"] = "dirichlet"
    num_clients: Int = Field(10, ge=1, le=MAX_CLIENTS, description="clients (HFL/DFL) or parties (VFL)")
    alpha: Number = Field(0.5, gt=0, description="Dirichlet concentration (smaller = more label skew)")
    test_fraction: Number = Field(0.2, ge=0, lt=1, description="share of samples held out for testing")
    features: str = Field("raw", pattern=r"^(raw|pca[1-9][0-9]*)$",
                          description="raw, or pca<k>: the first k principal components (fit on the held-out split)")
    unit_norm: Flag = Field(False, description="scale every sample to unit L2 norm (bounded features, R = 1)")
    canary_fraction: Number = Field(0.0, ge=0, lt=0.5, description="share of training samples that become "
                                   "mislabelled canaries (a wrong label drawn per ID; their IDs are listed in the "
                                   "partition manifest): a membership signal an audit can measure. HFL/DFL only")


class TopologyConfig(_Strict):
    """DFL communication graph (federation.topology): a ring, or Erdős–Rényi G(N, p) redrawn
    until connected. Not data, so not a DVC partition parameter."""

    kind: Literal["ring", "er"] = "ring"
    p: Number = Field(0.3, gt=0, le=1, description="Erdős–Rényi edge probability")
    seed: Seed | None = Field(None, description="Erdős–Rényi seed (None: the params' global seed)")


class Runtime(str, Enum):
    """What computes a scenario's federated training and unlearning: our own loop (``in-process``,
    the default and the tests' engine), or the Flower app (``fedunlearn_flower``) on a local
    deployment (``flower``: a SuperLink and a SuperNode per client on 127.0.0.1) or on Flower's
    simulation engine (``flower-simulation``). Flower runs the HFL scenarios only."""

    in_process = "in-process"
    flower = "flower"
    flower_simulation = "flower-simulation"


class ScenarioConfig(_Strict):
    dataset: Name
    setting: Setting
    model: str = "cnn"
    l2: Number = Field(0.0, ge=0, description="L2 regularisation in the per-sample objective (logreg)")
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    topology: TopologyConfig | None = Field(None, description="DFL only (default: a ring)")
    train: TrainConfig = Field(default_factory=TrainConfig)
    threads: Int | None = Field(None, ge=1, le=MAX_THREADS, description="torch intra-op threads while the benchmark and the deletion "
                                "batches compute (None: torch's default, one per core); 1 suits models whose steps "
                                "are too small for a second thread to pay off")
    runner: Runtime = Field(Runtime.in_process, description="the engine of training and unlearning: in-process (our "
                           "loop), flower (a local Flower deployment) or flower-simulation; Flower is HFL only")
    shards: Int = Field(1, ge=1, le=MAX_CLIENTS, description="K: the clients split into K shards, each training its own FedAvg model, "
                        "served as their ensemble; exact forgetting retrains only the shards that held a deleted sample "
                        "(fedunlearn/sharded_federation.py, docs/shards.md). 1: one federation. HFL, in-process only")
    shards_vectorised: Flag | None = Field(None, description="train the shards together as one vectorised batch "
                                           "(torch.func.vmap; federation/stacked_fedavg.py): True, False, or None: "
                                           "where a CUDA device is present")

    @model_validator(mode="after")
    def _partition_matches_setting(self) -> "ScenarioConfig":
        if (self.setting == "vfl") != (self.partition.scheme == "vertical"):
            raise ValueError(f"setting {self.setting!r} cannot use partition scheme {self.partition.scheme!r} "
                             "(VFL uses 'vertical'; HFL/DFL use 'iid' or 'dirichlet')")
        if self.setting == "vfl" and (self.partition.features != "raw" or self.partition.unit_norm):
            raise ValueError("feature transforms (features, unit_norm) apply to HFL/DFL partitions only")
        if self.setting == "vfl" and self.partition.canary_fraction > 0:
            raise ValueError("canaries (canary_fraction > 0) apply to HFL/DFL partitions only")
        if self.setting == "dfl" and self.topology is None:
            self.topology = TopologyConfig()
        if self.shards > 1 and (self.setting != "hfl" or self.runner != Runtime.in_process
                                or self.shards > self.partition.num_clients):
            raise ValueError(f"shards: {self.shards} needs an HFL scenario trained in-process with at least as many "
                             f"clients ({self.partition.num_clients}); use shards: 1 otherwise")
        if self.setting != "dfl" and self.topology is not None:
            raise ValueError(f"a topology applies to DFL scenarios only, not {self.setting!r}")
        return self


class RequestsConfig(_Strict):
    """How the inbox treats request files."""

    inbox_grace_seconds: Number = Field(300.0, ge=0, le=MAX_HOURS * 3600, description="a file that does not parse yet and changed less "
                                       "than this long ago is taken to be still being written: it waits for the "
                                       "next run instead of going to quarantine")
    deadline_days: Number = Field(30.0, gt=0, le=MAX_DAYS, description="a request's deadline when it names none: this long after "
                                 "submitted_at (GDPR Art. 12(3): one month)")
    urgent_hours: Number = Field(72.0, ge=0, le=MAX_HOURS, description="a request due within this long is urgent: submitting it "
                                "starts a batch at once")
    batch_threshold: Int = Field(10, ge=1, le=MAX_COUNT, description="this many requests submitted within batch_window_hours "
                                 "start a batch")
    batch_window_hours: Number = Field(1.0, gt=0, le=MAX_HOURS, description="the window of batch_threshold")
    max_wait_hours: Number = Field(24.0, gt=0, le=MAX_HOURS, description="a request still pending this long after its submission "
                                  "starts a batch")
    max_retrain_debt: Int = Field(50, ge=0, le=MAX_COUNT, description="requests forgotten only approximately (no exact retrain "
                                  "since) above which a deletion batch repays the debt with an exact retrain")
    exact_safety_factor: Number = Field(2.0, ge=1, le=100, description="the exact retrain that repays interim forgetting is "
                                       "scheduled this many times its last measured duration before the earliest "
                                       "owed deadline")
    exact_margin_hours: Number = Field(6.0, ge=0, le=MAX_HOURS, description="and this much earlier again: room for a failed run "
                                      "to be retried before the deadline")


# With fewer references a per-example variance is mostly noise (Carlini et al. 2022 pool it below 64).
PER_EXAMPLE_VARIANCE_MIN_REFERENCES = 64


class AuditConfig(_Strict):
    """How the references are trained and the audit judged (defaults are the documented ones)."""

    num_references: Int = Field(4, ge=2, le=MAX_REFERENCES, description="K reference models (≥ 2: a variance needs two)")
    reference_pool_fraction: Number = Field(
        0.5, gt=0, lt=1, description="share of the held-out split in pool A, the references' training pool; "
        "the rest (pool B) supplies the non-members")
    subset_fraction: Number = Field(0.5, gt=0, le=1,
                                   description="share of pool A each reference trains on (its own seeded subset)")
    epochs: Int = Field(20, ge=1, le=MAX_EPOCHS, description="central SGD epochs per reference")
    lr: Number = Field(0.05, gt=0, description="SGD learning rate of the references")
    batch_size: Int = Field(32, ge=1, le=MAX_BATCH_SIZE, description="SGD mini-batch size of the references")
    momentum: Number = Field(0.9, ge=0, lt=1, description="SGD momentum of the references")
    alpha: Number = Field(0.05, gt=0, lt=0.5, description="error rate of the verdict: an exact retrain is "
                         "called 'not forgotten' with probability ≤ alpha")
    tolerance: Number = Field(0.05, ge=0, lt=0.5, description="the forget set counts as forgotten while its AUC "
                             "against never-seen samples is ≤ 0.5 + tolerance")
    equivalence_beta: Number = Field(
        0.01, gt=0, lt=0.5, description="the interim tier's audit: the rate at which a candidate that looks like "
        "a retrain (true AUC 0.5) may be held back; sizes the equivalence margin to the audit's counts")
    fixed_variance: Flag | None = Field(
        None, description="one σ pooled over pool B (True) or a σ per example (False); None: pooled below "
        f"{PER_EXAMPLE_VARIANCE_MIN_REFERENCES} references (Carlini et al. 2022)")



class MlflowConfig(_Strict):
    """Where runs, models and their artifacts go."""

    tracking_uri: str | None = Field(
        None, pattern=r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$",
        description="an MLflow tracking server (http://HOST:PORT; it keeps the runs, the registry and, with "
        "--serve-artifacts, the artifacts) or a database URI; None: the workspace's own store, "
        "sqlite:///<workspace>/mlflow/mlflow.db with artifacts under mlflow/artifacts")


class Params(_Strict):
    seed: Seed = 0
    device: str = "auto"
    forgetting_policy: ForgettingPolicy = Field(
        ForgettingPolicy.interim, description="interim: an approximate version that fails no check serves at once, "
        "an exact retrain is scheduled before the earliest deadline; strict: escalate until a version passes every "
        "check (an exact retrain at worst)")
    prepare: list[Name] = Field(default_factory=list, description="datasets the prepare stage writes")
    datasets: dict[str, DatasetSpec] = Field(default_factory=dict, description="users' own data, by name: "
                                             "fedunlearn/dataset_specs.py (relative paths: to the workspace root)")
    requests: RequestsConfig = Field(default_factory=RequestsConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig, description="the per-example forgetting audit")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="the MLflow tracking store")
    scenarios: dict[Name, ScenarioConfig]

    @field_validator("datasets", mode="before")
    @classmethod
    def _dataset_names(cls, datasets: dict) -> dict:  # before the specs: a path-like name is named first
        if not isinstance(datasets, dict):
            return datasets  # pydantic names the type
        bad = [name for name in datasets if not isinstance(name, str) or not _NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"the dataset name {bad[0]!r} is not a name: use {NAME_RULE}")
        return datasets

    def scenario(self, name: str) -> ScenarioConfig:
        if name not in self.scenarios:
            raise ValueError(f"unknown scenario {name!r}; params.yaml defines: {', '.join(self.scenarios)}")
        return self.scenarios[name]


# params.yaml as parsed, by content: a deletion batch reads it some twenty times (every sub-flow opens
# the workspace), and YAML's pure-Python parser is slow.
_PARSED: dict[bytes, Any] = {}
# params.yaml is a few kilobytes; the cap only stops a wrong or hostile file being read whole.
MAX_PARAMS_BYTES = 4 << 20


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"params file not found: {path} (run from the project root or pass --root)")
    text = read_capped(path, "a params file", MAX_PARAMS_BYTES, f"restore {path} from the project's params.yaml")
    if text not in _PARSED:
        if len(_PARSED) >= 16:  # many workspaces or edits (tests): start over
            _PARSED.clear()
        _PARSED[text] = _parse_yaml(path, text)
    try:
        params = Params.model_validate(copy.deepcopy(_PARSED[text]))
        params.datasets = with_workspace_paths(params.datasets, path.parent)
        return params
    except ValidationError as err:
        problems = describe_validation(err, Params, {NAME_PATTERN: f"is not a name: use {NAME_RULE}"})
        raise InputError(f"{path}: {problems}. Fix it in {path} and run the command again; nothing was changed") from None


def _parse_yaml(path: Path, text: bytes) -> Any:
    """The YAML document, or ``InputError`` naming the file, the line and column, and the problem
    (YAML's own message names only ``<byte string>``)."""
    try:
        document = load_bounded(text)
    except YamlSyntax as err:
        if not err.problem.syntax:
            raise InputError(f"{path} is refused at {err}, then run the command again; nothing was changed") from None
        raise InputError(f"{path} is not valid YAML at {err}. Fix the syntax there (indentation, a missing ':' or "
                         "closing quote or bracket; compare with the project's params.yaml) and run the command "
                         "again; nothing was changed") from None
    if document is not None and not isinstance(document, dict):
        raise InputError(f"{path} must be a YAML mapping (keys such as `seed:`, `datasets:`, `scenarios:`), not a "
                         f"{type(document).__name__}: fix the file and run the command again")
    return document or {}

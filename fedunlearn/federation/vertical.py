"""Vertical federated learning: a split neural network over parties holding disjoint feature
slices of the same samples (the VFL of the FedORA paper, §III-A; DESIGN.md §2–3).

Roles. Every party holds one feature slice and a bottom model ϕ_i that turns it into an
embedding h_i. The active party (the last one) also holds the labels and the top model u over
concat(h_1, …, h_N). Samples are aligned by the intersection of the parties' sample IDs (the
paper's private set intersection, simulated in the clear: IDs are what the parties share).

The boundary. A ``Party`` is built from its own partition directory only and keeps nothing but
its slice (train and test rows), its sample IDs and its models; the coordinator
(``VerticalFederation``) tells parties which aligned positions to use and carries messages, it
never reads features. Every message goes through the ``Channel``: embeddings (party → active),
embedding gradients (active → party) and, for FedORA, a few control scalars. The channel counts
the bytes that cross a boundary (the active party's own embedding stays where it is) and lets
observers inspect every message, which is how the tests check that no features ever move.

Training (``fit``): split-NN mini-batch SGD, each party stepping its own parameters with the
embedding gradients it received. ``TrainConfig``: ``rounds`` = epochs over the aligned samples,
``lr``, ``batch_size``, ``momentum``; ``local_epochs``, ``client_fraction`` and ``server_lr`` are
FedAvg's and unused. Deterministic for a seed: initial weights from the seed the parties were
built with (``load_vertical``), shuffling from (seed, epoch).

The auditor's view. ``as_module`` returns one ``nn.Module`` computing the same logits from the
FULL feature tensor, sliced as the manifest says, and ``VerticalState`` holds the training and
test samples reassembled from the parties' slices. They exist for centralised evaluation and
attacks (accuracy, membership inference, functional distance) by an auditor trusted to see all
features; training and unlearning never use them.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedunlearn.config import TrainConfig
from fedunlearn.data.partition import slice_features
from fedunlearn.data.store import PARTITIONS_DIR, read_manifest
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.cost import Cost, flops_per_sample
from fedunlearn.federation.local import MapUpdates, Tensors, map_inline
from models.vfl import BottomModel, TopModel

# A loss maps (logits, labels) to a scalar tensor.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
PartyState = dict[str, torch.Tensor]
SPLITS = ("train", "test")


@dataclass(frozen=True)
class Message:
    """One transfer between parties. ``kind``: "embedding", "gradient" or "scalar"."""

    kind: str
    sender: int
    receiver: int
    tensor: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


class Channel:
    """Carries messages; counts those that cross a party boundary (sender ≠ receiver)."""

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.observers: list[Callable[[Message], None]] = []

    def send(self, message: Message) -> torch.Tensor:
        if message.sender != message.receiver:
            self.bytes_sent += message.num_bytes
        for observer in self.observers:
            observer(message)
        return message.tensor


class Party:
    """A passive party: its own feature slice (train and test rows), sample IDs and bottom model.

    ``model`` is an ``nn.ModuleDict`` with a ``"bottom"`` entry (the active party adds ``"top"``),
    so a party's state dict is its model's and the federation's state is one dict per party.
    """

    role = "passive"

    def __init__(self, index: int, features: np.ndarray, sample_ids: np.ndarray, test_features: np.ndarray,
                 model: nn.ModuleDict, device: torch.device):
        if len(features) != len(sample_ids):
            raise ValueError(f"party {index}: {len(features)} feature rows but {len(sample_ids)} sample IDs")
        self.index = index
        self.sample_ids = np.asarray(sample_ids).astype(str)
        self.features = {"train": torch.as_tensor(features, dtype=torch.float32, device=device),
                         "test": torch.as_tensor(test_features, dtype=torch.float32, device=device)}
        self.model = model.to(device)
        self.rows: torch.Tensor | None = None  # aligned position → own row, set by ``align``
        self._pending: torch.Tensor | None = None  # the last tracked embedding, awaiting its gradient

    def align(self, shared_ids: np.ndarray) -> None:
        """Map the federation's aligned order (the ID intersection) onto this party's rows."""
        row_of = {sid: row for row, sid in enumerate(self.sample_ids.tolist())}
        self.rows = torch.as_tensor([row_of[sid] for sid in shared_ids.tolist()], dtype=torch.long,
                                    device=self.features["train"].device)

    def _local(self, positions: torch.Tensor, split: str) -> torch.Tensor:
        # Test rows are in the same order at every party (the partition writes them so).
        return self.rows[positions] if split == "train" else positions

    def embed(self, positions: torch.Tensor, split: str = "train", *, track: bool = False) -> torch.Tensor:
        """h_i for the given rows. With ``track`` the graph is kept for ``backward``; what is
        returned (the message) is always detached."""
        x = self.features[split][self._local(positions, split)]
        bottom = _mode(self.model["bottom"], training=track)
        if track:
            self._pending = bottom(x)
            return self._pending.detach()
        with torch.no_grad():
            return bottom(x)

    def backward(self, embedding_grad: torch.Tensor) -> None:
        """∂L/∂θ_i = ∂L/∂h_i · ∂h_i/∂θ_i, accumulated into the bottom model's ``.grad``."""
        if self._pending is None:
            raise RuntimeError(f"party {self.index}: gradient received without a tracked embedding")
        self._pending.backward(embedding_grad)
        self._pending = None

    def audit_view(self, split: str) -> torch.Tensor:
        """This party's slice of ``split`` in the aligned order, for the auditor's view only."""
        every = torch.arange(self.num_rows(split), device=self.features[split].device)
        return self.features[split][self._local(every, split)]

    def num_rows(self, split: str) -> int:
        return len(self.rows) if split == "train" else len(self.features["test"])


class ActiveParty(Party):
    """The label holder: a passive party's slice and bottom model, plus the labels (train and
    test) and the top model over the concatenated embeddings."""

    role = "active"

    def __init__(self, index: int, features: np.ndarray, sample_ids: np.ndarray, test_features: np.ndarray,
                 model: nn.ModuleDict, device: torch.device, *, labels: np.ndarray, test_labels: np.ndarray):
        super().__init__(index, features, sample_ids, test_features, model, device)
        self.labels = {"train": torch.as_tensor(labels, dtype=torch.long, device=device),
                       "test": torch.as_tensor(test_labels, dtype=torch.long, device=device)}

    def labels_of(self, positions: torch.Tensor, split: str = "train") -> torch.Tensor:
        return self.labels[split][self._local(positions, split)]

    def head(self, embeddings: Sequence[torch.Tensor], positions: torch.Tensor,
             loss_fn: LossFn) -> tuple[float, list[torch.Tensor]]:
        """Top-model forward, the loss, and its backward: the top model's ``.grad`` is filled and
        ∂L/∂h_i is returned for every party (the messages to send back)."""
        received = [h.detach().requires_grad_() for h in embeddings]
        top = _mode(self.model["top"], training=True)
        loss = loss_fn(top(received), self.labels_of(positions))
        loss.backward()
        return float(loss.detach()), [h.grad for h in received]

    @torch.no_grad()
    def logits(self, embeddings: Sequence[torch.Tensor]) -> torch.Tensor:
        return _mode(self.model["top"], training=False)(list(embeddings))


class VerticalModel(nn.Module):
    """The auditor's view: logits from the FULL feature tensor, each bottom model applied to its
    manifest slice. For centralised evaluation and attacks only, never for training."""

    def __init__(self, bottoms: Sequence[nn.Module], top: nn.Module, slices: Sequence[dict]):
        super().__init__()
        self.bottoms = nn.ModuleList(bottoms)
        self.top = top
        self.slices = [dict(spec) for spec in slices]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.top([bottom(slice_features(x, spec)) for bottom, spec in zip(self.bottoms, self.slices)])


@dataclass(frozen=True)
class Meter:
    """What crossed and what was computed so far: bytes over the channel, samples through a
    forward-only pass and samples through a forward + backward pass."""

    comm_bytes: int = 0
    forward_samples: int = 0
    backprop_samples: int = 0


@dataclass
class FitResult:
    state: dict[str, PartyState]
    steps: int
    loss: float  # mean loss of the last epoch (of the steps taken in it)
    stopped_early: bool


class VerticalFederation:
    """The coordinator of a split-NN federation: aligns the parties, moves messages, runs
    training. ``parties[-1]`` is the active party; ``slices`` are the manifest's slice specs
    (used only by the auditor's view)."""

    def __init__(self, parties: Sequence[Party], *, slices: Sequence[dict], input_shape: tuple[int, ...],
                 num_classes: int, config: TrainConfig, seed: int, test_ids: np.ndarray | None = None):
        if len(parties) < 2 or not isinstance(parties[-1], ActiveParty) or \
                any(isinstance(p, ActiveParty) for p in parties[:-1]):
            raise ValueError("a vertical federation needs passive parties followed by exactly one active party")
        if len(slices) != len(parties):
            raise ValueError(f"{len(parties)} parties but {len(slices)} feature slices")
        self.parties = list(parties)
        self.active: ActiveParty = parties[-1]
        self.slices = [dict(spec) for spec in slices]
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.config = config
        self.seed = seed
        self.channel = Channel()
        self.forward_samples = 0
        self.backprop_samples = 0
        self.sample_ids = functools.reduce(np.intersect1d, [p.sample_ids for p in self.parties])
        if not len(self.sample_ids):
            raise ValueError("the parties share no sample IDs")
        for party in self.parties:
            party.align(self.sample_ids)
        num_test = {p.num_rows("test") for p in self.parties}
        if len(num_test) != 1:
            raise ValueError(f"the parties hold different numbers of test rows: {sorted(num_test)}")
        self.test_ids = np.asarray(test_ids).astype(str) if test_ids is not None else \
            np.array([f"test-{i}" for i in range(num_test.pop())])
        self._initial = self.state  # the seeded weights the parties were built with

    # --- bookkeeping ------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.active.labels["train"].device

    @property
    def num_samples(self) -> int:
        return len(self.sample_ids)

    def meter(self) -> Meter:
        return Meter(self.channel.bytes_sent, self.forward_samples, self.backprop_samples)

    def positions_of(self, sample_ids: Sequence[str]) -> torch.Tensor:
        """Aligned positions of shared sample IDs (an unknown ID is an error)."""
        wanted = np.asarray(sample_ids).astype(str)
        index = np.searchsorted(self.sample_ids, wanted)  # sample_ids is sorted (np.intersect1d)
        index = np.minimum(index, len(self.sample_ids) - 1)
        unknown = wanted[self.sample_ids[index] != wanted]
        if len(unknown):
            raise ValueError(f"{len(unknown)} sample ID(s) not shared by all parties, e.g. {unknown[:5].tolist()}")
        return torch.as_tensor(index, dtype=torch.long, device=self.device)

    @property
    def state(self) -> dict[str, PartyState]:
        """One state dict per party, keyed ``party_000`` …: the parties' current weights."""
        return {_key(p): {k: v.detach().clone() for k, v in p.model.state_dict().items()} for p in self.parties}

    def load_state(self, state: dict[str, PartyState]) -> None:
        for party in self.parties:
            party.model.load_state_dict(state[_key(party)])

    def initial_state(self) -> dict[str, PartyState]:
        return {name: {k: v.clone() for k, v in s.items()} for name, s in self._initial.items()}

    # --- messages ---------------------------------------------------------------------------------

    def send(self, kind: str, sender: int, receiver: int, tensor: torch.Tensor) -> torch.Tensor:
        return self.channel.send(Message(kind, sender, receiver, tensor))

    def gather_scalars(self, values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each party sends one scalar to the active party (e.g. its share of a norm)."""
        return [self.send("scalar", p.index, self.active.index, v.reshape(1)) for p, v in zip(self.parties, values)]

    def broadcast_scalars(self, values: torch.Tensor) -> list[torch.Tensor]:
        """The active party sends the same few scalars (e.g. step sizes) to every party."""
        return [self.send("scalar", self.active.index, p.index, values) for p in self.parties]

    # --- split-NN passes ----------------------------------------------------------------------------

    def backprop(self, positions: torch.Tensor, loss_fn: LossFn = F.cross_entropy) -> float:
        """One forward + backward over ``positions``: every party sends its embedding, the active
        party computes ``loss_fn(logits, labels)`` and sends each party ∂L/∂h_i. Afterwards every
        parameter's ``.grad`` holds (adds) the gradient of the loss; returns the loss."""
        embeddings = [self.send("embedding", p.index, self.active.index, p.embed(positions, track=True))
                      for p in self.parties]
        loss, grads = self.active.head(embeddings, positions, loss_fn)
        for party, grad in zip(self.parties, grads):
            party.backward(self.send("gradient", self.active.index, party.index, grad))
        self.backprop_samples += len(positions)
        return loss

    def zero_grad(self) -> None:
        for party in self.parties:
            party.model.zero_grad(set_to_none=True)

    def logits(self, positions: torch.Tensor | None = None, split: str = "train",
               batch_size: int = 1024) -> torch.Tensor:
        """Federated inference: the active party's logits (the embeddings still cross)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
        if positions is None:
            positions = torch.arange(self.active.num_rows(split), device=self.device)
        chunks = []
        for start in range(0, len(positions), batch_size):
            chunk = positions[start:start + batch_size]
            embeddings = [self.send("embedding", p.index, self.active.index, p.embed(chunk, split))
                          for p in self.parties]
            chunks.append(self.active.logits(embeddings))
            self.forward_samples += len(chunk)
        return torch.cat(chunks) if chunks else torch.empty(0, self.num_classes, device=self.device)

    def accuracy(self, positions: torch.Tensor | None = None, split: str = "test") -> float:
        """Accuracy of the current weights, computed at the active party (it holds the labels)."""
        if positions is None:
            positions = torch.arange(self.active.num_rows(split), device=self.device)
        if not len(positions):
            return float("nan")
        predicted = self.logits(positions, split).argmax(1)
        return float((predicted == self.active.labels_of(positions, split)).float().mean())

    def evaluate(self, state: dict[str, PartyState] | None = None) -> float:
        """Test accuracy of ``state`` (default: the current weights), each party embedding its own
        test slice."""
        if state is not None:
            self.load_state(state)
        return self.accuracy(split="test")

    # --- training -----------------------------------------------------------------------------------

    def fit(self, positions: torch.Tensor | None = None, *, state: dict[str, PartyState] | None = None,
            epochs: int | None = None, first_epoch: int = 0, lr: float | None = None, batch_size: int | None = None,
            loss_fn: LossFn = F.cross_entropy, clip_norm: float | None = None,
            stop: Callable[[float], bool] | None = None,
            on_epoch: Callable[[int, dict[str, PartyState], float], None] | None = None,
            map_updates: MapUpdates = map_inline) -> FitResult:
        """Split-NN mini-batch SGD over ``positions`` (default: all aligned samples), from ``state``
        (default: the seeded initial weights), for ``epochs`` (default ``config.rounds``).

        ``lr`` and ``batch_size`` override the config's; ``clip_norm`` clips each party's own
        gradient (a global norm would need every party's share); ``stop(loss)`` is checked on
        every mini-batch loss before its step and ends the run when true. Epoch e shuffles with
        (seed, e), counted from ``first_epoch``, so a later phase never repeats the original
        training's order. ``on_epoch(epoch, state, loss)`` is called after each completed epoch
        (1-based within this call). ``map_updates`` runs each epoch (every party's steps: one unit of
        work — a split-NN step needs every party's embedding, so the parties cannot run apart).
        """
        config = self.config
        positions = torch.arange(self.num_samples, device=self.device) if positions is None else positions
        batch_size = batch_size or config.batch_size
        self.load_state(self.initial_state() if state is None else state)
        optimizers = [torch.optim.SGD(p.model.parameters(), lr=config.lr if lr is None else lr,
                                      momentum=config.momentum) for p in self.parties]
        def split_nn_parties(epoch: int) -> tuple[float, int, float | None]:
            """One epoch of every party's mini-batch steps: (mean loss, steps, the loss that stopped it)."""
            order = positions[shuffled(len(positions), self.seed, epoch).to(self.device)]
            total, seen, steps = 0.0, 0, 0
            for start in range(0, len(order), batch_size):
                batch = order[start:start + batch_size]
                self.zero_grad()
                loss = self.backprop(batch, loss_fn)
                if stop is not None and stop(loss):
                    return total / max(seen, 1), steps, loss
                for party, optimizer in zip(self.parties, optimizers):
                    if clip_norm is not None:
                        nn.utils.clip_grad_norm_(party.model.parameters(), clip_norm)
                    optimizer.step()
                steps += 1
                total, seen = total + loss * len(batch), seen + len(batch)
            return total / max(seen, 1), steps, None

        steps, last = 0, float("nan")
        for epoch in range(first_epoch, first_epoch + (epochs if epochs is not None else config.rounds)):
            [(last, done, stopped_at)] = map_updates(split_nn_parties, [{"epoch": epoch}])
            steps += done
            if stopped_at is not None:
                return FitResult(self.state, steps, stopped_at, stopped_early=True)
            if on_epoch is not None:
                on_epoch(epoch - first_epoch + 1, self.state, last)
        return FitResult(self.state, steps, last, stopped_early=False)

    # --- the auditor's view ---------------------------------------------------------------------

    def as_module(self, state: dict[str, PartyState] | None = None) -> VerticalModel:
        """The auditor's view of ``state`` (default: the current weights) as one ``nn.Module`` over
        the full feature tensor. A copy: using it never touches the parties."""
        models = [copy.deepcopy(p.model) for p in self.parties]
        if state is not None:
            for party, model in zip(self.parties, models):
                model.load_state_dict(state[_key(party)])
        return VerticalModel([m["bottom"] for m in models], models[-1]["top"], self.slices).to(self.device)

    def audit_view(self, split: str) -> Tensors:
        """The samples of ``split`` with their full features, reassembled from every party's slice
        (train: in the aligned order), and the active party's labels. Auditor's view only."""
        parts = [p.audit_view(split) for p in self.parties]
        axis = 1 if "columns" in self.slices[0] else -2  # tabular columns, or image rows
        ids = self.sample_ids if split == "train" else self.test_ids
        labels = self.active.labels_of(torch.arange(len(ids), device=self.device), split)
        return Tensors(torch.cat(parts, dim=axis), labels, ids)


def shuffled(n: int, seed: int, index: int) -> torch.Tensor:
    """A permutation of range(n) seeded by (seed, index): epoch ``index`` of a run seeded ``seed``."""
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, index]).generate_state(1)[0]))
    return torch.randperm(n, generator=generator)


def _mode(module: nn.Module, *, training: bool) -> nn.Module:
    """Train or eval mode, switched only when it changes (``train()`` walks every submodule)."""
    if module.training != training:
        module.train(training)
    return module


def _key(party: Party) -> str:
    return f"party_{party.index:03d}"


def load_vertical(scenario: str, root: Path, device: torch.device, *, config: TrainConfig | None = None,
                  seed: int = 0, embedding_dim: int = 16, hidden: int = 64) -> VerticalFederation:
    """A federation from ``data/partitions/<scenario>``: party ``p`` reads only ``party_{p:03d}/``
    (the active party also the test labels); the models (``models.vfl``: a BottomModel per party,
    the TopModel at the active party) are built in party order after ``torch.manual_seed(seed)``."""
    manifest = read_manifest(scenario, Path(root))
    if manifest["setting"] != "vfl":
        raise ValueError(f"scenario {scenario!r} is {manifest['setting']}, not vertical; use load_horizontal")
    base = Path(root) / PARTITIONS_DIR / scenario

    def load(directory: Path, name: str) -> np.ndarray:
        return np.load(directory / f"{name}.npy", allow_pickle=False)

    torch.manual_seed(seed)
    specs = manifest["parties"]
    parties: list[Party] = []
    for spec in specs:
        directory = base / f"party_{spec['party']:03d}"
        features = load(directory, "features")
        model = nn.ModuleDict({"bottom": BottomModel(tuple(features.shape[1:]), embedding_dim, hidden)})
        args = (spec["party"], features, load(directory, "sample_ids"), load(directory, "test_features"))
        if spec["role"] == "active":
            model["top"] = TopModel(len(specs), int(manifest["num_classes"]), embedding_dim, hidden)
            parties.append(ActiveParty(*args, model, device, labels=load(directory, "labels"),
                                       test_labels=load(base / "test", "labels")))
        else:
            parties.append(Party(*args, model, device))
    return VerticalFederation(parties, slices=[s["slice"] for s in specs], input_shape=tuple(manifest["input_shape"]),
                              num_classes=int(manifest["num_classes"]), config=config or TrainConfig(), seed=seed,
                              test_ids=load(base / "test", "sample_ids"))


@dataclass
class VerticalState:
    """What a VFL unlearning method may use: the federation, the trained per-party ``state``, and
    the auditor's view of the training samples (``samples``, in the aligned order) and test split.

    Requests are keyed by shared sample IDs: a ``ForgetSet`` for VFL has the single key 0,
    meaning "all parties" (every party holds every aligned sample). ``clients`` is therefore the
    one-element list ``[samples]``, so ``resolve_request(kind, subject, fed_state.clients)``
    resolves class and sample requests unchanged. The attributes ``UnlearningMethod.unlearn`` and
    ``Monitor`` read (``setting``, ``clients``, ``forget_data``, ``model_from``, ``test``) mirror
    ``FederatedState``'s, so they need no VFL branch; methods train only through ``federation``.
    """

    federation: VerticalFederation
    state: dict[str, PartyState]
    samples: Tensors
    test: Tensors
    setting: str = "vfl"
    map_updates: MapUpdates = map_inline  # runs each split-NN epoch (inline, or a Prefect task run in the flows)

    @classmethod
    def from_federation(cls, federation: VerticalFederation, state: dict[str, PartyState]) -> "VerticalState":
        return cls(federation, state, federation.audit_view("train"), federation.audit_view("test"))

    @property
    def train_config(self) -> TrainConfig:
        return self.federation.config

    @property
    def seed(self) -> int:
        return self.federation.seed

    @property
    def device(self) -> torch.device:
        return self.federation.device

    @property
    def num_classes(self) -> int:
        return self.federation.num_classes

    @property
    def clients(self) -> list[Tensors]:
        return [self.samples]

    def engine(self) -> VerticalFederation:
        return self.federation

    def model_from(self, state: dict[str, PartyState]) -> VerticalModel:
        return self.federation.as_module(state)

    def forget_masks(self, forget_set: ForgetSet) -> dict[int, np.ndarray]:
        """{0: mask over the aligned samples}; checks the batch's key and that every ID is shared."""
        if set(forget_set.forget_ids) != {0}:
            raise ValueError(f"{forget_set.batch_id}: a VFL batch holds its IDs under key 0 (all parties), "
                             f"got keys {sorted(forget_set.forget_ids)}")
        ids = forget_set.forget_ids[0]
        mask = np.zeros(self.federation.num_samples, dtype=bool)
        mask[self.federation.positions_of(ids).cpu().numpy()] = True
        return {0: mask}

    def positions(self, forget_set: ForgetSet) -> tuple[torch.Tensor, torch.Tensor]:
        """(forget, retained) aligned positions."""
        mask = torch.as_tensor(self.forget_masks(forget_set)[0], device=self.device)
        return torch.nonzero(mask).flatten(), torch.nonzero(~mask).flatten()

    def forget_data(self, forget_set: ForgetSet) -> Tensors:
        return self.samples.select(self.forget_masks(forget_set)[0])

    def forget_by_client(self, forget_set: ForgetSet) -> dict[int, Tensors]:
        return {0: self.forget_data(forget_set)}

    def retained_clients(self, forget_set: ForgetSet) -> list[Tensors]:
        return [self.samples.select(~self.forget_masks(forget_set)[0])]

    def class_fraction_ids(self, labels: Sequence[int], fraction: float, seed: int = 0) -> np.ndarray:
        """A seeded ``fraction`` (at least one sample) of the samples of each class in ``labels``:
        the paper's sample unlearning (m classes, n% of their samples). Pass the IDs to
        ``resolve_request("sample", ids, fed_state.clients)``."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        y = self.samples.y.cpu().numpy()
        chosen = []
        for label in sorted(set(int(c) for c in labels)):
            ids = self.samples.sample_ids[y == label]
            if not len(ids):
                raise ValueError(f"class {label} has no training samples")
            count = min(len(ids), max(1, round(fraction * len(ids))))
            chosen.append(np.random.default_rng([seed, label]).choice(ids, size=count, replace=False))
        return np.sort(np.concatenate(chosen))

    def cost_since(self, before: Meter) -> Cost:
        """FLOPs and bytes since ``before``: F·(samples back-propagated) with F the training FLOPs
        of one sample (forward + backward, ``flops_per_sample``), F/3 per forward-only sample, and
        the bytes that crossed the channel (embeddings, embedding gradients, scalars)."""
        now = self.federation.meter()
        model = self.federation.as_module()
        train = flops_per_sample(model, self.federation.input_shape)
        forward = flops_per_sample(model, self.federation.input_shape, include_backward=False)
        flops = train * (now.backprop_samples - before.backprop_samples) + \
            forward * (now.forward_samples - before.forward_samples)
        return Cost(flops=float(flops), comm_bytes=now.comm_bytes - before.comm_bytes)


__all__ = ["ActiveParty", "Channel", "FitResult", "Message", "Meter", "Party", "VerticalFederation",
           "VerticalModel", "VerticalState", "load_vertical"]

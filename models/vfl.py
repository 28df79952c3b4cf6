import math

import torch
from torch import nn


class BottomModel(nn.Module):
    """A party's model over its own feature slice; outputs an embedding (all that leaves the party)."""

    def __init__(self, input_shape: tuple[int, ...], embedding_dim: int = 16, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.ReLU(),
                                 nn.Linear(hidden, embedding_dim), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class TopModel(nn.Module):
    """The active party's head over the concatenated embeddings of all parties."""

    def __init__(self, num_parties: int, num_classes: int, embedding_dim: int = 16, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_parties * embedding_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, embeddings: list[torch.Tensor]):
        return self.net(torch.cat(embeddings, dim=1))

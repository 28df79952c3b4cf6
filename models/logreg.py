import math

import torch
from torch import nn


class LogisticRegression(nn.Module):
    """Multinomial logistic regression. ``l2`` is λ in the objective
    ``mean_i CE_i + (λ/2)‖W‖²``: with λ > 0 it is λ-strongly convex, which the Newton-style
    unlearning methods and their certificates rely on."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, l2: float = 0.0):
        super().__init__()
        self.l2 = float(l2)
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1))

    def regularizer(self) -> torch.Tensor:
        return 0.5 * self.l2 * sum((p ** 2).sum() for p in self.parameters())

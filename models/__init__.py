"""Network architectures, built by name: ``build_model(name, input_shape, num_classes)``.

``mlp``, ``cnn`` (2 conv + 2 dense), ``resnet18`` (torchvision, GroupNorm instead of BatchNorm:
batch statistics do not average meaningfully across federated clients), ``logreg`` (multinomial
logistic regression whose L2 term is part of the objective), and the VFL bottom/top models.
"""

from __future__ import annotations

import torch
from torch import nn

from models.cnn import SmallCNN
from models.logreg import LogisticRegression
from models.mlp import MLP
from models.resnet import resnet18_groupnorm
from models.vfl import BottomModel, TopModel

MODEL_NAMES = ("mlp", "cnn", "resnet18", "logreg")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, *, l2: float = 0.0,
                seed: int | None = None) -> nn.Module:
    """A freshly initialised model; with ``seed`` the initial weights are reproducible."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if seed is not None:
        torch.manual_seed(seed)
    if name == "mlp":
        return MLP(input_shape, num_classes)
    if name == "cnn":
        if len(input_shape) != 3:
            raise ValueError(f"model 'cnn' needs image input (C, H, W), got shape {input_shape}; use 'mlp'")
        return SmallCNN(input_shape, num_classes)
    if name == "resnet18":
        return resnet18_groupnorm(input_shape, num_classes)
    return LogisticRegression(input_shape, num_classes, l2=l2)


__all__ = ["build_model", "MODEL_NAMES", "MLP", "SmallCNN", "LogisticRegression", "BottomModel",
           "TopModel", "resnet18_groupnorm"]

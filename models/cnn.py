import torch
from torch import nn


class SmallCNN(nn.Module):
    """2 conv + 2 dense layers (the small CNN of the HFL scenarios; docs/DESIGN.md §4, docs/BENCHMARKS.md)."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, width: int = 16, hidden: int = 128):
        super().__init__()
        channels = input_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        with torch.no_grad():
            flat = self.features(torch.zeros(1, *input_shape)).shape[1]
        self.classifier = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))

from functools import partial

from torch import nn


def resnet18_groupnorm(input_shape: tuple[int, int, int], num_classes: int, groups: int = 8) -> nn.Module:
    """torchvision ResNet-18 with GroupNorm; a 3×3 stem without max-pool for small images."""
    # Imported here: torchvision.models is slow to import, which every `fedunlearn` command paid at start.
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes, norm_layer=partial(nn.GroupNorm, groups))
    model.conv1 = nn.Conv2d(input_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model

"""Plain `nn.Module` networks and a factory that builds one by name. No Lightning here.

`create_net("small_cnn", ...)` fits 8x8 digits; any torchvision classification model name (`resnet18`,
`efficientnet_b0`, ...) builds that backbone with a fresh head. Pretrained weights download on first use, so they
are off by default.
"""

from torch import Tensor, nn

from ..engine import UsageError


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks, optional dropout and a linear head: about 100k parameters, enough for 8x8 to 32x32
    images."""

    def __init__(self, num_classes: int, in_channels: int = 1, width: int = 32, dropout: float = 0.0) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            # No conv bias: the BatchNorm right after it has its own shift.
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *block(in_channels, width),
            *block(width, 2 * width),
            nn.MaxPool2d(2),
            *block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


def torchvision_backbone(name: str, num_classes: int, in_channels: int = 3, pretrained: bool = False) -> nn.Module:
    """A torchvision classifier by name, its head resized to `num_classes`.

    With `pretrained=True` the ImageNet weights are downloaded (needs a network) and only the head is new.
    """
    import torchvision  # imported here: the digits default never needs it

    if in_channels != 3:
        raise UsageError(f"torchvision backbones take 3-channel images, got in_channels={in_channels}")
    if pretrained:
        net = torchvision.models.get_model(name, weights="DEFAULT")
        _replace_head(net, num_classes)
        return net
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def _replace_head(net: nn.Module, num_classes: int) -> None:
    """Swap the last Linear layer (`fc`, `classifier.1`, `heads.head`, ...) for a fresh one with `num_classes`."""
    name, head = [(name, m) for name, m in net.named_modules() if isinstance(m, nn.Linear)][-1]
    net.set_submodule(name, nn.Linear(head.in_features, num_classes))


def create_net(
    arch: str, num_classes: int, in_channels: int = 1, pretrained: bool = False, dropout: float = 0.0
) -> nn.Module:
    """Build a network by name: "small_cnn" or any torchvision classification model name (`dropout` is small_cnn's,
    before its head; torchvision models keep their own)."""
    if arch == "small_cnn":
        if pretrained:
            raise UsageError("small_cnn has no pretrained weights: set pretrained=False or pick a torchvision arch")
        return SmallCNN(num_classes, in_channels, dropout=dropout)
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if arch not in available:
        raise UsageError(f"unknown arch {arch!r}: use 'small_cnn' or a torchvision model such as 'resnet18'")
    return torchvision_backbone(arch, num_classes, in_channels, pretrained)

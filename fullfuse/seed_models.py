"""The two seed pipelines (the default problems of every tool) and their input shapes."""
from __future__ import annotations

import torch
from torch import nn

SEED_SHAPE = {"A": (128, 8, 256, 256), "B": (16, 32, 32, 32, 32)}
SMALL_SHAPE = {"A": (2, 8, 32, 32), "B": (2, 32, 8, 8, 8)}   # for machines without a GPU


class SeedA(nn.Module):
    """Conv2d(8->64, k=3) -> GELU (erf) -> AdaptiveAvgPool2d(1) -> squeeze (dims=3: the same with Conv3d)."""

    def __init__(self, in_channels=8, out_channels=64, kernel_size=3, dims=2, stride=1, padding=0):
        super().__init__()
        self.conv = (nn.Conv2d if dims == 2 else nn.Conv3d)(in_channels, out_channels, kernel_size, stride=stride,
                                                            padding=padding)
        self.act = nn.GELU()
        self.pool = (nn.AdaptiveAvgPool2d if dims == 2 else nn.AdaptiveAvgPool3d)(1)

    def forward(self, x):
        return self.pool(self.act(self.conv(x))).squeeze()


class SeedB(nn.Module):
    """ConvTranspose3d(32->64, k=5, s=2, p=2) -> MaxPool3d(2) -> MaxPool3d(3) -> sum(dim=1, keepdim=True)."""

    def __init__(self, in_channels=32, out_channels=64, kernel_size=5, stride=2, padding=2):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.pool1 = nn.MaxPool3d(2)
        self.pool2 = nn.MaxPool3d(3)

    def forward(self, x):
        return torch.sum(self.pool2(self.pool1(self.conv_transpose(x))), dim=1, keepdim=True)


def _conv_args(conv: tuple | None) -> tuple:
    """(out_channels, kernel_size, stride, padding) of family A's conv: the seed's where not given."""
    defaults = (64, 3, 1, 0)
    conv = tuple(conv or ())
    if len(conv) == 1 or len(conv) > 4:
        raise ValueError(f"fullfuse: conv takes out_channels,kernel_size[,stride[,padding]], got {conv}")
    return conv + defaults[len(conv):]


def seed_model(family: str, in_channels: int | None = None, dims: int = 2, conv: tuple | None = None) -> nn.Module:
    """The family's seed model; family A with dims=3 (a 5-d input shape) is its Conv3d form, and with
    conv = (out_channels, kernel_size[, stride[, padding]]) its convolution changed to that."""
    if family == "A":
        out_channels, kernel_size, stride, padding = _conv_args(conv)
        return SeedA(in_channels or 8, out_channels, kernel_size, dims, stride, padding)
    return SeedB(in_channels or 32)

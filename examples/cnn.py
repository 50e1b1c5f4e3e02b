"""A small convolutional image classifier, inference (native tpu-tune contract, no sequence).

Batch 32 of 3x64x64 images, four conv stages. Convolutions are untouched by matmul precision;
bf16 autocast and channels_last memory format are what speed them up (docs/knobs.md, `memory_format`).
Run: tpu-tune profile examples/cnn.py
"""

import torch
from torch import nn


def _stage(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 100) -> None:
        super().__init__()
        self.features = nn.Sequential(_stage(3, 32), _stage(32, 64), _stage(64, 128), _stage(128, 256))
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).mean(dim=(2, 3)))


BATCH_SIZE = 32
IMAGE_SIZE = 64


def build_model() -> nn.Module:
    return SmallCNN().eval()


def make_batch(batch_size: int, seq_len: int | None) -> torch.Tensor:
    """A batch of random images; this model has no sequence length, so seq_len is ignored."""
    return torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)

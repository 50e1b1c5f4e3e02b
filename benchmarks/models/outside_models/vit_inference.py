"""A ViT-Small-shaped image classifier from transformers (inference): the vision model of
benchmarks/models/beyond_obvious.py. Built from a config, no weights downloaded.

Batch 8 of 3x112x112 images (49 patches of 16x16); ViT-S/16 widths (384 hidden, 6 heads), 6 layers:
sized for a 2-core host.
"""

import torch
from torch import nn
from transformers import ViTConfig, ViTForImageClassification

BATCH_SIZE = 8
IMAGE_SIZE = 112


def build_model() -> nn.Module:
    config = ViTConfig(
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=6,
        intermediate_size=1536,
        image_size=IMAGE_SIZE,
        num_labels=1000,
    )
    return ViTForImageClassification(config).eval()


def make_batch(batch_size: int, seq_len: int | None) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)}

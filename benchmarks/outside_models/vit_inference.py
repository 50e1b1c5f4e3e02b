"""A ViT-Small-shaped image classifier from transformers (inference): the vision model of
benchmarks/beyond_obvious.py. Built from a config, no weights downloaded.

Batch 16 of 3x224x224 images; ViT-S/16 widths (384 hidden, 6 heads, 12 layers).
"""

import torch
from torch import nn
from transformers import ViTConfig, ViTForImageClassification

BATCH_SIZE = 16


def build_model() -> nn.Module:
    config = ViTConfig(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536, num_labels=1000
    )
    return ViTForImageClassification(config).eval()


def make_batch(batch_size: int, seq_len: int | None) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch_size, 3, 224, 224)}

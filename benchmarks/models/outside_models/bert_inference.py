"""A BERT-base-shaped encoder from transformers (inference, sequence classification): the
transformer-inference model of benchmarks/models/beyond_obvious.py. Built from a config, no weights.

Batch 8 of 64 tokens; BERT-base widths (768 hidden, 12 heads), 4 layers (sized for a 2-core host):
linear-heavy.
"""

import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

BATCH_SIZE = 8
SEQ_LEN = 64


def build_model() -> nn.Module:
    return BertForSequenceClassification(BertConfig(num_hidden_layers=4, num_labels=2)).eval()


def make_batch(batch_size: int, seq_len: int | None) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30522, (batch_size, seq_len or SEQ_LEN), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

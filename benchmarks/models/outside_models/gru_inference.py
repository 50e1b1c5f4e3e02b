"""A two-layer GRU language model (inference): the recurrent model of
benchmarks/models/beyond_obvious.py. torch.compile captures no graph through nn.GRU's fused kernel,
so every compiled setting falls back or fails there: the case issue 38's attribution names.

Batch 16 of 64 tokens, 256 hidden, vocabulary 4,000.
"""

import torch
from torch import nn

BATCH_SIZE = 16
SEQ_LEN = 64
VOCAB = 4000


class GruLanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 256)
        self.rnn = nn.GRU(256, 256, num_layers=2, batch_first=True)
        self.head = nn.Linear(256, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


def build_model() -> nn.Module:
    return GruLanguageModel().eval()


def make_batch(batch_size: int, seq_len: int | None) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch_size, seq_len or SEQ_LEN), generator=torch.Generator().manual_seed(0))

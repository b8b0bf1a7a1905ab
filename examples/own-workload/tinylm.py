"""A tiny causal transformer language model and its training step, on generated data.

The sequences count upwards (t, t+1, t+2, ... modulo the vocabulary), so the
loss falls within a few steps. ``TINYLM_LAYERS`` (default 2) sets the depth:
the knob the README turns to show a verdict and a counter diff.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, SEQ_LEN, BATCH = 256, 64, 4, 64, 8


class TinyLM(nn.Module):
    def __init__(self, layers: int | None = None) -> None:
        super().__init__()
        layers = int(os.environ.get("TINYLM_LAYERS", 2)) if layers is None else layers
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(SEQ_LEN, WIDTH))
        block = nn.TransformerEncoderLayer(WIDTH, HEADS, dim_feedforward=2 * WIDTH, dropout=0.0,
                                           batch_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        x = self.embed(tokens) + self.position[:n]
        return self.head(self.blocks(x, mask=mask, is_causal=True))


def batches(rank: int, device: torch.device, batch_size: int = BATCH, seed: int = 0):
    """Endless batches of counting sequences, different on every rank."""
    generator = torch.Generator().manual_seed(seed + rank)
    steps = torch.arange(SEQ_LEN + 1)
    while True:
        start = torch.randint(VOCAB, (batch_size, 1), generator=generator)
        yield ((start + steps) % VOCAB).to(device)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()

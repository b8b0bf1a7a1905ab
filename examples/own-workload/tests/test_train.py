"""tinylm's training step, measured by perfsuite in 2 ranks on CPU (gloo).

The body runs in every rank, not in the pytest process: heavy imports stay
inside it, so collecting this file imports no torch.
"""

import pytest


@pytest.mark.perf_ranks(2)
def test_train_step(perf_dist, perf_steps):
    import torch
    from tinylm import BATCH, SEQ_LEN, TinyLM, batches, train_step
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(TinyLM().to(perf_dist.device), device_ids=perf_dist.device_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = [train_step(model, optimizer, tokens)
              for tokens in perf_steps(batches(perf_dist.rank, perf_dist.device), warmup=3,
                                       steps=20, items=BATCH * SEQ_LEN)]
    assert losses[-1] < losses[0], f"rank {perf_dist.rank}: the loss did not fall: {losses}"

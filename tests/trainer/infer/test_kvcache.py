"""The KV cache against the model's own forward pass: same logits at every step, rows of different
lengths in one step, and a finished row replaced by the last one; sampling parameters."""

from __future__ import annotations

import torch

from trainer.infer.kvcache import GPTAdapter, KVCache, SamplingParams, sample
from trainer.model.gpt import GPT
from trainer.spec.presets import MODELS


def test_cached_batched_decoding_equals_full_forward():
    torch.manual_seed(0)
    model = GPT(MODELS["tiny"]).eval()
    cache = KVCache(GPTAdapter(model), 4, device="cpu", dtype=torch.float32)
    seqs = [[1, 2, 3], [5, 6, 7, 8, 9, 10], [11]]
    for s in seqs:
        _, logits = cache.prefill(s)
        torch.testing.assert_close(logits, model(torch.tensor([s]))[0])
    nxt = [4, 11, 12]
    for step in range(6):
        logits = cache.decode(nxt)
        assert logits.shape == (len(nxt), model.shape.vocab_size)
        for i in range(cache.n):
            seqs[i] = seqs[i] + [nxt[i]]
            torch.testing.assert_close(logits[i], model(torch.tensor([seqs[i]]))[0], rtol=1e-4, atol=1e-5)
        nxt = [t + 1 for t in nxt]
        if step == 1:  # row 0 finishes: the last row moves into it
            assert cache.release(0) == 2
            seqs[0], nxt[0] = seqs.pop(), nxt.pop()
    assert cache.lengths[: cache.n] == [len(s) for s in seqs]


def test_sampling_rows_follow_their_own_parameters():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.9]] * 4)
    gen = torch.Generator().manual_seed(0)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=2.0, top_k=1),
              SamplingParams(temperature=1.0, top_p=0.01), SamplingParams(temperature=1.0, top_k=2)]
    for _ in range(50):
        a, b, c, d = sample(logits, params, gen)
        assert a == b == c == 1
        assert d in (1, 3)

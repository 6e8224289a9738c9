"""``trainer.serve`` answers the official openai client for the architectures beyond GPT-2: a rotary
model with grouped KV heads and SwiGLU, and an Atlas model (memory carried per sequence). Each greedy
completion equals the trainer's own generate() loop, which recomputes the whole context every token;
two concurrent streams decode in the same steps."""

from __future__ import annotations

import dataclasses
import threading

import openai
import pytest
import torch

from tests.trainer.conftest import write_checkpoint
from trainer.spec.presets import MODELS

SPECS = {
    "rope-gqa": dataclasses.replace(MODELS["7b"], name="rope-gqa", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                    d_ff=96, vocab_size=256, max_seq_len=128),
    "atlas": dataclasses.replace(MODELS["300m-atlas"], name="atlas", d_model=64, n_layers=2, n_heads=4, d_ff=96,
                                 vocab_size=256, max_seq_len=128, d_key=32, d_value=32, context_window=4),
}
PROMPT = "def main():\n    "


@pytest.fixture(scope="module", params=sorted(SPECS))
def served(request, tmp_path_factory):
    from trainer.serve import load, make_server

    # the memory's chunk as the trainer saved it: chunk ends fall inside the prompt and the completion
    ckpt = write_checkpoint(tmp_path_factory.mktemp(request.param), spec=SPECS[request.param], seed=3,
                            memory_chunk=8)
    api = load(ckpt, device="cpu", max_batch=4)
    assert all(m.chunk_size == 8 for m in api.engine.model.modules() if hasattr(m, "chunk_size"))
    httpd = make_server(api, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", api
    httpd.shutdown()
    httpd.server_close()
    api.engine.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def _reference(api, prompt: str, n: int) -> str:
    tok, model = api.engine.tokenizer, api.engine.model
    ids = tok.encode(prompt)
    out = model.generate(torch.tensor([ids]), n, temperature=0)[0, len(ids):].tolist()
    if tok.eot in out:
        out = out[: out.index(tok.eot)]
    return tok.decode(out)


def test_greedy_completion_and_stream_match_generate(served):
    url, api = served
    c = _client(url)
    r = c.completions.create(model=api.model_id, prompt=PROMPT, max_tokens=24, temperature=0)
    want = _reference(api, PROMPT, 24)
    assert r.choices[0].text == want and len(want) > 0
    chunks = list(c.chat.completions.create(model=api.model_id, messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=24, temperature=0, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_concurrent_prompts_of_different_lengths_each_match_generate(served):
    url, api = served
    prompts = ["x = 1\n", "class Tree:\n    def __init__(self):\n        ", "import os"]
    got: dict[str, str] = {}

    def ask(p: str) -> None:
        got[p] = _client(url).completions.create(model=api.model_id, prompt=p, max_tokens=20,
                                                 temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert got == {p: _reference(api, p, 20) for p in prompts}

"""trainer.serve driven by the official openai client: completions, chat, streaming, stop, limits,
two clients at once, and the API's error shape for bad requests."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import openai
import pytest
import torch

PROMPT = "def main():\n    "


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def reference(api, prompt: str, n_tokens: int) -> str:
    """The trainer's own generate() loop, greedy, decoded the same way (cut at end-of-text)."""
    tok = api.engine.tokenizer
    model = api.engine.adapter.model
    ids = tok.encode(prompt)
    out = model.generate(torch.tensor([ids]), n_tokens, temperature=0)[0, len(ids):].tolist()
    if tok.eot in out:
        out = out[: out.index(tok.eot)]
    return tok.decode(out)


def test_models_lists_the_checkpoint(server, tiny_checkpoint):
    url, api = server
    models = client(url).models.list()
    assert [m.id for m in models.data] == [tiny_checkpoint.name]
    assert client(url).models.retrieve(tiny_checkpoint.name).id == tiny_checkpoint.name


def test_greedy_completion_matches_the_trainers_generate(server):
    url, api = server
    r = client(url).completions.create(model=api.model_id, prompt=PROMPT, max_tokens=40, temperature=0)
    assert r.choices[0].text == reference(api, PROMPT, 40)
    assert r.usage.prompt_tokens == len(PROMPT.encode())
    assert r.usage.completion_tokens <= 40
    assert r.choices[0].finish_reason in ("length", "stop")


def test_streaming_gives_the_same_text_in_pieces(server):
    url, api = server
    c = client(url)
    whole = c.completions.create(model=api.model_id, prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    chunks = list(c.completions.create(model=api.model_id, prompt=PROMPT, max_tokens=30, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    texts = [ch.choices[0].text for ch in chunks if ch.choices]
    assert len(texts) > 1 and "".join(texts) == whole
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("length", "stop")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 30


def test_chat_plain_concatenation_and_streaming(server):
    url, api = server
    c = client(url)
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "import os"}]
    r = c.chat.completions.create(model=api.model_id, messages=messages, max_tokens=20, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == reference(api, "You write Python.\nimport os\n", 20)
    parts = [ch.choices[0].delta.content or "" for ch in
             c.chat.completions.create(model=api.model_id, messages=messages, max_tokens=20, temperature=0,
                                       stream=True)]
    assert "".join(parts) == r.choices[0].message.content


def test_stop_sequence_and_max_tokens(server):
    url, api = server
    c = client(url)
    full = reference(api, PROMPT, 60)
    change = next(i for i in range(1, len(full)) if full[i] != full[0])  # a stop that spans two tokens
    stop = full[change - 1: change + 1]
    r = c.completions.create(model=api.model_id, prompt=PROMPT, max_tokens=60, temperature=0, stop=[stop, "@@@@"])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=api.model_id, prompt=PROMPT, max_tokens=60, temperature=0, stop=stop, stream=True))
    assert streamed == r.choices[0].text
    r = c.completions.create(model=api.model_id, prompt="x", max_tokens=3, temperature=1.0, top_p=0.9,
                             extra_body={"top_k": 5})
    assert r.usage.completion_tokens <= 3


def test_sampling_parameters_shape_the_output(server):
    url, api = server
    c = client(url)
    # top_k=1 is greedy whatever the temperature
    r = c.completions.create(model=api.model_id, prompt=PROMPT, max_tokens=20, temperature=1.5,
                             extra_body={"top_k": 1})
    assert r.choices[0].text == reference(api, PROMPT, 20)
    r = c.completions.create(model=api.model_id, prompt=PROMPT, max_tokens=20, temperature=1.0, n=3)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2]


def test_two_concurrent_streams_are_decoded_together(server):
    url, api = server
    prompts = ["import sys\n", "class Foo:\n"]
    results: dict[int, str] = {}
    errors: list[BaseException] = []
    api.engine.peak_batch = 0

    def run(i: int) -> None:
        try:
            stream = client(url).completions.create(model=api.model_id, prompt=prompts[i], max_tokens=120,
                                                    temperature=0, stream=True)
            results[i] = "".join(ch.choices[0].text for ch in stream)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert results == {i: reference(api, p, 120) for i, p in enumerate(prompts)}
    assert api.engine.peak_batch == 2


@pytest.mark.parametrize("kwargs, status, param", [
    ({"temperature": 5}, 400, "temperature"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"top_p": 0}, 400, "top_p"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "gpt-4"}, 404, "model"),
    ({"prompt": "x" * 300}, 400, "prompt"),
])
def test_bad_requests_get_the_error_shape(server, kwargs, status, param):
    url, api = server
    args = {"model": api.model_id, "prompt": "hi", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.APIStatusError) as info:
        client(url).completions.create(**args)
    assert info.value.status_code == status
    assert info.value.body["param"] == param and info.value.body["message"]


def raw(url: str, data: bytes | None, method: str = "POST") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("path, data, status", [
    ("/completions", b"{not json", 400),
    ("/completions", b"[1, 2]", 400),
    ("/chat/completions", b'{"messages": []}', 400),
    ("/chat/completions", b'{"messages": [{"role": "user"}]}', 400),
    ("/completions", b'{"prompt": [99999]}', 400),
    ("/completions", b'{"prompt": "a", "stream": "yes"}', 400),
    ("/nowhere", b"{}", 404),
])
def test_malformed_bodies_never_give_a_traceback(server, path, data, status):
    url, api = server
    code, body = raw(url + path, data)
    assert code == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in body["error"]["message"]

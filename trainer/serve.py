"""An OpenAI-compatible server for a checkpoint: ``python -m trainer.serve --checkpoint DIR [--port P]``.

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``, with
``temperature``, ``top_p``, ``top_k`` and ``ignore_eos`` (extensions, as vLLM has them), ``max_tokens``, ``stop``, ``n``
and ``stream`` (server-sent events, ending with ``data: [DONE]``), as in
https://platform.openai.com/docs/api-reference/completions. DIR is what ``trainer.sample`` takes: a
checkpoint, a run's ``checkpoints`` folder or a run folder (its best checkpoint).

Chat messages become one prompt through the tokenizer's chat template when the checkpoint has one
(``chat_template`` in ``tokenizer_config.json``, rendered with jinja2), else by plain concatenation:
the messages' contents, one per line, as the model was trained on plain text.

Standard library HTTP (a thread per connection); the decoding is batched by one scheduler thread
(``trainer.infer.engine``). A bad request gets the API's error object with a 4xx status, never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import queue
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from trainer.infer.engine import Delta, Engine, Sequence
from trainer.infer.kvcache import SamplingParams

log = logging.getLogger("trainer.serve")

MAX_BODY = 4 << 20
MAX_CHOICES = 16
MAX_STOPS = 4
WAIT_S = 600.0  # a request gives up when its sequences make no progress for this long


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


# --- request parsing -----------------------------------------------------------------------------


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ApiError(400, f"'{name}' must be a number from {lo:g} to {hi:g}, got {v!r}", name)
    return float(v)


def _integer(body: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ApiError(400, f"'{name}' must be an integer from {lo} to {hi}, got {v!r}", name)
    return v


def _stops(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them", "stop")
    return tuple(stops)


class Server:
    """The model, its tokenizer and the scheduler; turns a request body into sequences."""

    def __init__(self, engine: Engine, model_id: str, chat_template: str | None = None) -> None:
        self.engine = engine
        self.model_id = model_id
        self.chat_template = chat_template
        self.created = int(time.time())

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "gpucli"}

    def chat_prompt(self, body: dict) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ApiError(400, f"messages[{i}] must have a string 'role' and a string 'content'",
                               f"messages[{i}]")
        if self.chat_template:
            import jinja2  # optional: jinja2 only for a chat template

            env = jinja2.Environment(undefined=jinja2.StrictUndefined)
            try:
                return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=True)
            except jinja2.TemplateError as e:
                raise ApiError(400, f"the chat template could not render these messages: {e}", "messages") from e
        return "".join(m["content"] + "\n" for m in messages)

    def sequences(self, body: dict, chat: bool) -> tuple[list[Sequence], queue.Queue[Delta], int]:
        """The request's sequences (queued on one queue), and the number of prompt tokens."""
        model = body.get("model")
        if model is not None and model != self.model_id:
            raise ApiError(404, f"The model '{model}' does not exist (this server has '{self.model_id}')",
                           "model", "model_not_found")
        tok = self.engine.tokenizer
        if chat:
            prompts = [tok.encode(self.chat_prompt(body))]
        else:
            prompts = self._prompts(body.get("prompt"))
        n = _integer(body, "n", 1, 1, MAX_CHOICES)
        assert n is not None
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        if top_p == 0:
            raise ApiError(400, "'top_p' must be above 0", "top_p")
        top_k = _integer(body, "top_k", 0, -1, 1 << 30) or 0
        limit = body.get("max_completion_tokens") if chat and body.get("max_tokens") is None else None
        max_tokens = _integer({"max_tokens": limit} if limit is not None else body, "max_tokens", 16 if not chat else None,
                              1, 1 << 20)
        stops = _stops(body)
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise ApiError(400, "'ignore_eos' must be true or false", "ignore_eos")
        params = SamplingParams(temperature=temperature, top_k=max(top_k, 0), top_p=top_p)
        out: queue.Queue[Delta] = queue.Queue()
        seqs = []
        room = self.engine.max_len
        for p_i, ids in enumerate(prompts):
            ids = ids or [tok.eot]
            if len(ids) > room:
                raise ApiError(400, f"This model's maximum context length is {room} tokens; the prompt has "
                                    f"{len(ids)}", "messages" if chat else "prompt", "context_length_exceeded")
            for c in range(n):
                seqs.append(Sequence(index=p_i * n + c, prompt=ids, params=params,
                                     max_tokens=max_tokens or room, stop=stops, out=out,
                                     ignore_eos=ignore_eos))
        return seqs, out, sum(len(ids) or 1 for ids in prompts)

    def _prompts(self, prompt: Any) -> list[list[int]]:
        tok = self.engine.tokenizer
        vocab = self.engine.adapter.vocab_size
        if prompt is None:
            prompt = ""
        if isinstance(prompt, str):
            return [tok.encode(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [tok.encode(p) for p in prompt]

        def ids(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                               for t in x)
        if ids(prompt) and prompt:
            return [list(prompt)]
        if isinstance(prompt, list) and prompt and all(ids(p) and p for p in prompt):
            return [list(p) for p in prompt]
        raise ApiError(400, "'prompt' must be a string, a list of strings, or token ids below the vocabulary "
                            f"size {vocab}", "prompt")


# --- HTTP ----------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainer.serve"
    api: Server  # set on the subclass made by make_server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.info("%s %s", self.address_string(), format % args)

    def _send_json(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, err: ApiError) -> None:
        self._send_json(err.status, err.body())

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            if method == "GET" and path == "/v1/models":
                self._send_json(200, {"object": "list", "data": [self.api.model_card()]})
            elif method == "GET" and path.startswith("/v1/models/"):
                if path[len("/v1/models/"):] != self.api.model_id:
                    raise ApiError(404, f"The model '{path[len('/v1/models/'):]}' does not exist", "model",
                                   "model_not_found")
                self._send_json(200, self.api.model_card())
            elif method == "GET" and path in ("", "/health"):
                self._send_json(200, {"status": "ok", "model": self.api.model_id})
            elif path in ("/v1/completions", "/v1/chat/completions"):
                if method != "POST":
                    raise ApiError(405, f"{path} takes POST")
                self._generate(self._body(), chat=path.endswith("chat/completions"))
            else:
                raise ApiError(404, f"no route {method} {path}", code="unknown_url")
        except ApiError as err:
            if method == "POST" and err.status in (404, 405):  # the body was not read: do not reuse the stream
                self.close_connection = True
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:
            log.exception("request failed")
            self._error(ApiError(500, "internal server error", kind="server_error"))

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def _body(self) -> dict[str, Any]:
        try:
            size = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            raise ApiError(411, "a request body with Content-Length is required") from None
        if not 0 <= size <= MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
        raw = self.rfile.read(size)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    def _generate(self, body: dict[str, Any], chat: bool) -> None:
        seqs, out, prompt_tokens = self.api.sequences(body, chat)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be true or false", "stream")
        opts = body.get("stream_options") or {}
        usage_chunk = bool(isinstance(opts, dict) and opts.get("include_usage"))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.api.engine.submit(seqs)
        try:
            if stream:
                self._stream(seqs, out, rid, chat, prompt_tokens, usage_chunk)
            else:
                self._complete(seqs, out, rid, chat, prompt_tokens)
        finally:
            self.api.engine.cancel(seqs)  # a no-op for finished ones; frees rows of an abandoned request

    def _deltas(self, seqs: list[Sequence], out: queue.Queue[Delta]):
        left = len(seqs)
        while left:
            try:
                d = out.get(timeout=WAIT_S)
            except queue.Empty:
                raise ApiError(503, "the server made no progress on this request", kind="server_error") from None
            if d.finish_reason:
                left -= 1
            yield d

    def _complete(self, seqs: list[Sequence], out: queue.Queue[Delta], rid: str, chat: bool,
                  prompt_tokens: int) -> None:
        texts = [""] * len(seqs)
        finish: list[str | None] = [None] * len(seqs)
        used = [0] * len(seqs)
        for d in self._deltas(seqs, out):
            texts[d.index] += d.text
            used[d.index] = d.completion_tokens
            finish[d.index] = d.finish_reason or finish[d.index]
        if "error" in finish:
            raise ApiError(500, "generation failed on the server", kind="server_error")
        if chat:
            choices: list[dict[str, Any]] = [
                {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": f, "logprobs": None}
                for i, (t, f) in enumerate(zip(texts, finish, strict=True))]
        else:
            choices = [{"index": i, "text": t, "finish_reason": f, "logprobs": None}
                       for i, (t, f) in enumerate(zip(texts, finish, strict=True))]
        self._send_json(200, {
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.api.model_id, "choices": choices, "usage": _usage(prompt_tokens, sum(used))})

    def _stream(self, seqs: list[Sequence], out: queue.Queue[Delta], rid: str, chat: bool, prompt_tokens: int,
                usage_chunk: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        created = int(time.time())
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.api.model_id}
        if chat:
            self._event({**base, "choices": [{"index": s.index, "delta": {"role": "assistant", "content": ""},
                                              "finish_reason": None, "logprobs": None} for s in seqs]})
        used = [0] * len(seqs)
        try:
            for d in self._deltas(seqs, out):
                used[d.index] = d.completion_tokens
                if not d.text and not d.finish_reason:
                    continue
                if chat:
                    choice: dict[str, Any] = {"index": d.index, "delta": {"content": d.text} if d.text else {}}
                else:
                    choice = {"index": d.index, "text": d.text}
                choice.update(finish_reason=d.finish_reason, logprobs=None)
                self._event({**base, "choices": [choice]})
        except ApiError as err:  # the status line is gone: the error travels as an event
            self._event(err.body())
        if usage_chunk:
            self._event({**base, "choices": [], "usage": _usage(prompt_tokens, sum(used))})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, obj: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up is routine; anything else is logged (not printed to stderr raw)."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            log.exception("connection from %s failed", client_address)


def make_server(api: Server, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"api": api})
    return _HTTPServer((host, port), handler)


def load(checkpoint: Path, *, device: str, max_batch: int = 8, seed: int = 0,
         model_id: str | None = None) -> Server:
    """The checkpoint loaded the trainer's way (``trainer.sample.load_for_inference``), with its engine
    started. On CUDA the weights and the cache are bf16."""
    import torch  # lazy: the HTTP layer is used and tested without torch

    from trainer.sample import load_for_inference  # lazy: imports torch (see above)

    model, tok, meta = load_for_inference(checkpoint, device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model.to(dtype)
    path = Path(meta["path"])
    template = None
    config = path / "tokenizer_config.json"
    if config.exists():
        try:
            template = json.loads(config.read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError):
            template = None
    engine = Engine(model, tok, max_batch=max_batch, device=device, dtype=dtype, seed=seed).start()
    return Server(engine, model_id or path.name, template if isinstance(template, str) else None)


def main(argv: list[str] | None = None) -> int:
    import torch  # lazy: the HTTP layer is used and tested without torch

    ap = argparse.ArgumentParser(prog="python -m trainer.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint, checkpoints folder or run folder")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-batch", type=int, default=8, help="sequences decoded together (default 8)")
    ap.add_argument("--model-name", default=None, help="the id clients use (default: the checkpoint's folder)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not 0 <= args.port <= 65535 or args.max_batch < 1:
        print("error: --port must be 0..65535 and --max-batch at least 1", file=sys.stderr)
        return 2
    try:
        api = load(Path(args.checkpoint), device=args.device, max_batch=args.max_batch, seed=args.seed,
                   model_id=args.model_name)
    except (FileNotFoundError, KeyError, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        httpd = make_server(api, args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    host, port = httpd.server_address[:2]
    print(f"serving {api.model_id} at http://{host}:{port}/v1", flush=True)
    thread = threading.Thread(target=httpd.serve_forever, name="serve-http", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.shutdown()
        api.engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

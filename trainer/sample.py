"""Generate text from a checkpoint: ``python -m trainer.sample --checkpoint DIR --prompt TEXT``.

DIR is a checkpoint (``.../checkpoints/step_000500``), a run's ``checkpoints`` folder, the run
folder itself, or the folder ``gpucli fetch-best --dest DIR`` put checkpoints in; but for the first,
the best checkpoint by val loss is used (else the newest).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from trainer.data.loader import BPETokenizer, ByteTokenizer, Tokenizer
from trainer.loop import checkpoint as ckpt
from trainer.model.gpt import GPT
from trainer.spec.resolve import ModelShape


def _has_weights(p: Path) -> bool:
    return (p / "meta.json").exists() and ((p / "model.pt").exists() or (p / ckpt.WEIGHTS_FILE).exists())


def _rank(p: Path) -> tuple[float, int]:
    """Lowest validation loss first, then the later step."""
    meta = ckpt.read_meta(p) or {}
    val = meta.get("val_loss")
    return (val if isinstance(val, (int, float)) else float("inf")), -int(meta.get("step") or 0)


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder; in a run or checkpoints folder, the one of lowest validation loss (the
    ``best`` folder the trainer keeps, or a periodic checkpoint when that one is as good)."""
    path = Path(path)
    if _has_weights(path):
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    # A folder `gpucli fetch-best --dest` filled: it holds checkpoints under their own names
    # (RUN-step_000500); one is that one, several are chosen between by val loss, then step.
    held = [p for p in sorted(root.iterdir()) if _has_weights(p)] if root.is_dir() else []
    if held and not any(p.name.startswith("step_") for p in held):
        return min(held, key=_rank)
    found = ckpt.list_checkpoints(root)
    candidates = [p for p in (ckpt.best_checkpoint(root), root / ckpt.BEST_DIR) if p is not None and _has_weights(p)]
    if candidates:
        return min(candidates, key=_rank)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {path}")
    return found[0][1]


def load_for_inference(path: Path, device: str = "cpu") -> tuple[GPT, Tokenizer, dict]:
    """Model (eval mode, on ``device``), its tokenizer and meta.json, from a checkpoint directory."""
    path = resolve_checkpoint(path)
    meta = ckpt.read_meta(path)
    if meta is None:
        raise FileNotFoundError(f"{path}/meta.json is missing or unreadable")
    model = GPT(ModelShape(**meta["model_shape"]))
    model.load_state_dict(ckpt.load_model_state(path))
    if meta.get("memory_chunk"):  # the memory's update granularity when it was saved (TNT's stage)
        max_norm = (((meta.get("config") or {}).get("training") or {}).get("memory") or {}).get("max_norm")
        model.set_memory_options(int(meta["memory_chunk"]), max_norm)
    model.to(device).eval()
    kind = meta.get("tokenizer", "byte")
    if kind == "byte":
        tok: Tokenizer = ByteTokenizer()
    else:
        tok = BPETokenizer.load(path / "tokenizer.json")
    meta["path"] = str(path)
    return model, tok, meta


def read_prompts(path: Path) -> list[str]:
    """One prompt per line, or JSON lines with a "prompt" field (``\\n`` inside a JSON prompt is kept)."""
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("{"):
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as e:
                raise ValueError(f"line {n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise ValueError(f"line {n}: a JSON line needs a string 'prompt' field")
            prompts.append(obj["prompt"])
        else:
            prompts.append(line.rstrip("\n"))
    if not prompts:
        raise ValueError("no prompts in it")
    return prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.sample", description=__doc__)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--prompt", action="append", default=[], help="repeatable; default: one empty prompt")
    ap.add_argument("--prompts-file", help="prompts to run, one per line (blank lines and '#' comments skipped), "
                    "or JSON lines with a 'prompt' field; e.g. an evaluation set run at every checkpoint")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", action="store_true", help="one JSON object per prompt")
    args = ap.parse_args(argv)
    prompts = list(args.prompt)
    if args.prompts_file:
        try:
            prompts += read_prompts(Path(args.prompts_file))
        except (OSError, ValueError) as e:
            print(f"error: --prompts-file {args.prompts_file}: {e}", file=sys.stderr)
            return 2
    try:
        model, tok, meta = load_for_inference(Path(args.checkpoint), args.device)
    except (FileNotFoundError, KeyError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    for prompt in prompts or [""]:
        ids = tok.encode(prompt) or [tok.eot]
        idx = torch.tensor([ids], device=args.device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device.startswith("cuda")):
            out = model.generate(idx, args.max_new_tokens, args.temperature, args.top_k, generator=gen)
        text = tok.decode(out[0, len(ids):].tolist())
        if args.json:
            print(json.dumps({"checkpoint": meta["path"], "step": meta["step"], "prompt": prompt, "text": text}))
        else:
            print(prompt + text)
            print("-" * 40)
    return 0


if __name__ == "__main__":
    sys.exit(main())

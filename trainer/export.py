"""A checkpoint in the Hugging Face layout: ``model.safetensors``, ``config.json``,
``generation_config.json`` and the tokenizer files, for each architecture that a transformers model
class computes exactly; any other is refused in one line naming the field that does not map.

    python -m trainer.export CHECKPOINT OUT

Which class (each checked in tests/trainer/test_export.py: same logits as the trainer's model):

- learned positions, LayerNorm, GELU, one KV head per head: ``GPT2LMHeadModel`` (nanoGPT's model);
- rotary, RMSNorm, SwiGLU, grouped KV heads: ``LlamaForCausalLM``; with QK-norm ``Qwen3ForCausalLM``;
- rotary, LayerNorm, SwiGLU (QK-norm too): ``StableLmForCausalLM``;
- rotary, LayerNorm, GELU, one KV head per head: ``GPTNeoXForCausalLM``.

What makes it exact: bias-free layers become zero biases; the parameter-free RMSNorm becomes a weight
of ones with the eps torch uses (the dtype's machine epsilon); nanochat's norm right after the
embedding is folded into the table (a row-wise norm of a lookup is a lookup of normed rows; the head
then keeps the raw table, untied); the trainer's rotary layout rotates each head's two halves the
other way from transformers' ``rotate_half``, which is the same rotation with the halves swapped, so
the q and k rows of each head are stored with their halves swapped (q.k is unchanged by the same
permutation of both). Nothing of the Atlas memory, the refinement steps, soft-capped logits or the
squared-ReLU MLP has a transformers class here (transformers' NanoChat model, where installed, is
not used: it is not in the transformers this was tested with).

Torch, safetensors and the checkpoint are all this needs (not transformers), so it runs on the pod.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer.data.fastbpe import bytes_to_unicode
from trainer.data.tokenizer import CHAR_FORMAT, EOT_CANDIDATES
from trainer.loop import checkpoint as ckpt
from trainer.sample import resolve_checkpoint
from trainer.spec.modelspec import ModelSpec
from trainer.spec.resolve import ModelShape

EPS32 = float(torch.finfo(torch.float32).eps)  # F.rms_norm's eps when none is given (fp32 weights)


class ExportError(ValueError):
    """The checkpoint cannot be exported; the message is one line naming the field."""


@dataclass(frozen=True)
class Exported:
    out: Path
    architecture: str
    files: tuple[str, ...]
    params: int


def target(s: ModelSpec) -> str:
    """The transformers class that computes ``s`` exactly, or ExportError naming what does not map."""
    if s.memory:
        raise ExportError("model.memory (the Atlas memory) has no Hugging Face model class: not exportable")
    if s.refine_steps:
        raise ExportError(f"model.refine_steps={s.refine_steps} (refinement steps) has no Hugging Face model class")
    if s.logit_softcap:
        raise ExportError(f"model.logit_softcap={s.logit_softcap:g} has no match in the exportable classes "
                          "(GPT-2, Llama, Qwen3, StableLM, GPT-NeoX)")
    if s.mlp == "relu2":
        raise ExportError("model.mlp=relu2 (squared ReLU) has no match in the exportable classes")
    if s.pos_embedding == "learned":
        for bad, field in ((s.norm != "layernorm", f"model.norm={s.norm}"), (s.mlp != "gelu", f"model.mlp={s.mlp}"),
                           (s.qk_norm, "model.qk_norm"), (s.kv_heads != s.n_heads, "model.n_kv_heads")):
            if bad:
                raise ExportError(f"{field} with learned positions does not map to GPT2LMHeadModel")
        return "GPT2LMHeadModel"
    if s.norm == "rmsnorm":
        if s.mlp != "swiglu":
            raise ExportError(f"model.mlp={s.mlp} with RMSNorm does not map (Llama and Qwen3 are SwiGLU)")
        return "Qwen3ForCausalLM" if s.qk_norm else "LlamaForCausalLM"
    if s.mlp == "swiglu":
        return "StableLmForCausalLM"
    for bad, field in ((s.qk_norm, "model.qk_norm"), (s.kv_heads != s.n_heads, "model.n_kv_heads")):
        if bad:
            raise ExportError(f"{field} with rotary positions, LayerNorm and GELU does not map to GPTNeoXForCausalLM")
    return "GPTNeoXForCausalLM"


def _swap_halves(w: torch.Tensor, heads: int, hd: int) -> torch.Tensor:
    """Rows of each head's block with its two halves swapped (the rotary layout; module docstring)."""
    lead = w.shape[1:]
    return w.reshape(heads, 2, hd // 2, *lead).flip(1).reshape(heads * hd, *lead)


def _split_qkv(s: ModelSpec, w: torch.Tensor, rotary: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = w.split([s.d_model, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=0)
    if rotary:
        q, k = _swap_halves(q, s.n_heads, s.head_dim), _swap_halves(k, s.kv_heads, s.head_dim)
    return q, k, v


def convert(s: ModelSpec, sd: dict[str, torch.Tensor], eot: int) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """(class name, config.json, tensors) of the trainer's state dict ``sd``."""
    arch = target(s)
    sd = {k: v.detach().float().cpu() for k, v in sd.items()}
    L, d = s.n_layers, s.d_model
    wte = sd["wte.weight"]
    head = sd.get("lm_head.weight", wte)
    if s.norm == "rmsnorm":  # nanochat's norm after the embedding, folded into the table (docstring)
        wte = F.rms_norm(wte, (d,))
    tied = "lm_head.weight" not in sd and s.norm != "rmsnorm"
    out: dict[str, torch.Tensor] = {}
    common = {"vocab_size": s.vocab_size, "hidden_size": d, "num_hidden_layers": L, "num_attention_heads": s.n_heads,
              "intermediate_size": s.d_ff, "max_position_embeddings": s.max_seq_len, "tie_word_embeddings": tied,
              "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": "float32", "architectures": [arch]}
    if arch == "GPT2LMHeadModel":
        cfg = {"model_type": "gpt2", "architectures": [arch], "vocab_size": s.vocab_size, "n_embd": d, "n_layer": L,
               "n_head": s.n_heads, "n_inner": s.d_ff, "n_positions": s.max_seq_len, "n_ctx": s.max_seq_len,
               "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
               "attn_pdrop": 0.0, "tie_word_embeddings": tied, "bos_token_id": eot, "eos_token_id": eot,
               "torch_dtype": "float32"}
        out["transformer.wte.weight"], out["transformer.wpe.weight"] = wte, sd["wpe.weight"]
        for i in range(L):
            p, b = f"blocks.{i}.", f"transformer.h.{i}."
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                out[b + theirs + ".weight"], out[b + theirs + ".bias"] = sd[p + ours + ".weight"], torch.zeros(d)
            for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
                                 ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
                w = sd[p + ours + ".weight"]
                out[b + theirs + ".weight"], out[b + theirs + ".bias"] = w.t().contiguous(), torch.zeros(w.shape[0])
        out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = sd["ln_f.weight"], torch.zeros(d)
    elif arch == "GPTNeoXForCausalLM":
        cfg = dict(common, model_type="gpt_neox", rotary_pct=1.0, rotary_emb_base=10000, hidden_act="gelu_new",
                   layer_norm_eps=1e-5, use_parallel_residual=False, attention_bias=True, hidden_dropout=0.0,
                   attention_dropout=0.0)
        out["gpt_neox.embed_in.weight"] = wte
        hd = s.head_dim
        for i in range(L):
            p, b = f"blocks.{i}.", f"gpt_neox.layers.{i}."
            q, k, v = _split_qkv(s, sd[p + "attn.qkv.weight"], True)
            # GPT-NeoX's fused projection is head-major: [q_h, k_h, v_h] for each head h
            fused = torch.stack([x.reshape(s.n_heads, hd, d) for x in (q, k, v)], 1).reshape(3 * d, d)
            out[b + "attention.query_key_value.weight"], out[b + "attention.query_key_value.bias"] = fused, torch.zeros(3 * d)
            for ours, theirs in (("attn.proj", "attention.dense"), ("mlp.fc", "mlp.dense_h_to_4h"),
                                 ("mlp.proj", "mlp.dense_4h_to_h")):
                w = sd[p + ours + ".weight"]
                out[b + theirs + ".weight"], out[b + theirs + ".bias"] = w, torch.zeros(w.shape[0])
            for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
                out[b + theirs + ".weight"], out[b + theirs + ".bias"] = sd[p + ours + ".weight"], torch.zeros(d)
        out["gpt_neox.final_layer_norm.weight"], out["gpt_neox.final_layer_norm.bias"] = sd["ln_f.weight"], torch.zeros(d)
        if not tied:
            out["embed_out.weight"] = head
    else:  # the Llama family: Llama, Qwen3, StableLM
        if arch == "StableLmForCausalLM":
            cfg = dict(common, model_type="stablelm", num_key_value_heads=s.kv_heads, hidden_act="silu",
                       layer_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=1.0, use_qkv_bias=False,
                       qk_layernorm=s.qk_norm, use_parallel_residual=False, hidden_dropout=0.0, attention_dropout=0.0)
        else:
            cfg = dict(common, model_type="qwen3" if s.qk_norm else "llama", num_key_value_heads=s.kv_heads,
                       head_dim=s.head_dim, hidden_act="silu", rms_norm_eps=EPS32, rope_theta=10000.0,
                       attention_bias=False, mlp_bias=False, attention_dropout=0.0)
            if s.qk_norm:
                cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=L)
        layer_norm = arch == "StableLmForCausalLM"
        out["model.embed_tokens.weight"] = wte
        for i in range(L):
            p, b = f"blocks.{i}.", f"model.layers.{i}."
            q, k, v = _split_qkv(s, sd[p + "attn.qkv.weight"], True)
            for name, w in (("q_proj", q), ("k_proj", k), ("v_proj", v), ("o_proj", sd[p + "attn.proj.weight"])):
                out[b + f"self_attn.{name}.weight"] = w
            gate, up = sd[p + "mlp.fc.weight"].chunk(2, dim=0)
            out[b + "mlp.gate_proj.weight"], out[b + "mlp.up_proj.weight"] = gate, up
            out[b + "mlp.down_proj.weight"] = sd[p + "mlp.proj.weight"]
            for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
                out[b + theirs + ".weight"] = sd[p + ours + ".weight"] if layer_norm else torch.ones(d)
                if layer_norm:
                    out[b + theirs + ".bias"] = torch.zeros(d)
            if s.qk_norm:
                for ours, heads in (("q", s.n_heads), ("k", s.kv_heads)):
                    if layer_norm:  # one norm per head, each with the shared weight, halves swapped
                        w = _swap_halves(sd[p + f"attn.{ours}_norm.weight"][:, None], 1, s.head_dim)[:, 0]
                        for h in range(heads):
                            out[b + f"self_attn.{ours}_layernorm.norms.{h}.weight"] = w.clone()
                    else:
                        out[b + f"self_attn.{ours}_norm.weight"] = torch.ones(s.head_dim)
        out["model.norm.weight"] = sd["ln_f.weight"] if layer_norm else torch.ones(d)
        if layer_norm:
            out["model.norm.bias"] = torch.zeros(d)
    if arch != "GPTNeoXForCausalLM" and not tied:
        out["lm_head.weight"] = head
    return arch, cfg, {k: v.contiguous() for k, v in out.items()}


def write_tokenizer(meta: dict, src: Path, out: Path) -> tuple[str, ...]:
    """tokenizer.json (a ``tokenizers`` file), tokenizer_config.json and special_tokens_map.json."""
    kind = meta.get("tokenizer", "byte")
    file = src / "tokenizer.json"
    text = file.read_text() if file.exists() else ""
    if kind == "byte":
        eot_text = "<|endoftext|>"
        tok_json = _byte_tokenizer_json(eot_text)
    elif CHAR_FORMAT in text[:200]:
        raise ExportError("tokenizer: the character table has no Hugging Face tokenizer here (byte and BPE only)")
    elif text:
        eot_text = _eot_text(text)
        tok_json = text
    else:
        raise ExportError(f"tokenizer: {kind} checkpoint without its tokenizer.json")
    (out / "tokenizer.json").write_text(tok_json)
    special = {"eos_token": eot_text, "bos_token": eot_text, "unk_token": eot_text}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    config = dict(special, tokenizer_class="PreTrainedTokenizerFast", model_max_length=int(meta["model_shape"]
                  ["max_seq_len"]), clean_up_tokenization_spaces=False)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return ("tokenizer.json", "special_tokens_map.json", "tokenizer_config.json")


def _eot_text(tokenizer_json: str) -> str:
    """The end-of-text token of a ``tokenizers`` file, found as the trainer finds it."""
    from tokenizers import Tokenizer  # optional on the pod: only for a trained BPE

    tok = Tokenizer.from_str(tokenizer_json)
    found = [t for t in EOT_CANDIDATES if tok.token_to_id(t) is not None]
    if not found:
        raise ExportError(f"tokenizer: none of the end-of-text tokens {', '.join(EOT_CANDIDATES)}")
    return found[0]


def _byte_tokenizer_json(eot_text: str) -> str:
    """The byte tokenizer (id = the byte, 256 = end of text) as a ``tokenizers`` byte-level BPE
    without merges: GPT-2's byte-to-character table maps each byte to its one-character token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # optional: only for a trained BPE

    table = bytes_to_unicode()
    tok = Tokenizer(models.BPE({table[b]: b for b in range(256)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([eot_text])
    return tok.to_str()


def export(checkpoint: Path, out: Path) -> Exported:
    """Write the export of ``checkpoint`` (a checkpoint, or a run / checkpoints folder: its best) to
    ``out`` (made, or emptied of these files). ExportError for an architecture that does not map."""
    path = resolve_checkpoint(Path(checkpoint))
    meta = ckpt.read_meta(path)
    if meta is None:
        raise FileNotFoundError(f"{path}/meta.json is missing or unreadable")
    spec = ModelShape(**meta["model_shape"])
    target(spec)  # refuse before reading gigabytes
    state = ckpt.load_model_state(path)
    out = Path(out)
    tmp = out.with_name(f".tmp_{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok_files = write_tokenizer(meta, path, tmp)
    from tokenizers import Tokenizer  # optional on the pod: the export's tokenizer file is checked with it

    tok_json = (tmp / "tokenizer.json").read_text()
    eot = int(Tokenizer.from_str(tok_json).token_to_id(_eot_text(tok_json)))
    arch, cfg, tensors = convert(spec, state, eot)
    ckpt.save_safetensors(tensors, tmp / ckpt.WEIGHTS_FILE, {"format": "pt"})
    cfg["gpucli"] = {"step": meta.get("step"), "val_loss": meta.get("val_loss"), "preset": spec.name}
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = {"bos_token_id": eot, "eos_token_id": eot, "do_sample": True, "temperature": 0.8, "top_k": 50,
           "max_length": spec.max_seq_len}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    files = (ckpt.WEIGHTS_FILE, "config.json", "generation_config.json", *tok_files)
    return Exported(out, arch, files, sum(t.numel() for t in tensors.values()))


def push(folder: Path, repo: str, *, private: bool) -> str:
    """Upload the export in ``folder`` to the Hub repository ``repo`` (made when missing) with
    huggingface_hub; the token comes from HF_TOKEN (or huggingface_hub's own login file), the Hub
    from HF_ENDPOINT when set. Returns the repository's URL."""
    try:
        from huggingface_hub import HfApi  # optional: only --push needs it
    except ImportError:
        raise ExportError("--push needs the huggingface_hub package here (pip install huggingface_hub)") from None
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=os.environ.get("HF_TOKEN") or None)
    url = api.create_repo(repo, private=private, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message="Upload model exported by gpucli")
    return str(url)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="checkpoint folder, or a run / checkpoints folder (its best)")
    ap.add_argument("out", help="the folder to write (replaced)")
    ap.add_argument("--push", metavar="ORG/NAME", help="then upload it to this Hugging Face Hub repository")
    ap.add_argument("--private", action="store_true", help="make the Hub repository private when it is created")
    args = ap.parse_args(argv)
    if args.push is not None and args.push.count("/") != 1:
        print(f"error: --push {args.push}: the repository is ORG/NAME", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        done = export(Path(args.checkpoint), Path(args.out))
        print(f"exported {done.architecture} ({done.params / 1e6:.1f}M parameters) to {done.out} "
              f"in {time.perf_counter() - t0:.1f}s: {', '.join(done.files)}", flush=True)
        if args.push:
            print(f"pushed to {push(done.out, args.push, private=args.private)}", flush=True)
    except (ExportError, FileNotFoundError, KeyError, ValueError, OSError) as e:
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m trainer.export``: each architecture a transformers class computes exactly is written in
the Hugging Face layout, loaded by transformers on CPU, and gives the trainer's logits (<= 1e-4, fp32)
and the same greedy text through its own tokenizer files; the others are refused in one line naming
the field."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.export import ExportError, export, target
from trainer.loop import checkpoint as ckpt
from trainer.model.gpt import GPT
from trainer.spec.modelspec import ModelSpec
from trainer.spec.presets import MODELS

transformers = pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[2]


def tiny(spec: ModelSpec, **over: object) -> ModelSpec:
    return dataclasses.replace(spec, name=f"{spec.name}-tiny", d_model=64, n_layers=2, n_heads=4, d_ff=96,
                               vocab_size=257, max_seq_len=64, **over)  # type: ignore[arg-type]


LLAMA = {"pos_embedding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "tied_embeddings": False, "n_kv_heads": 2}
EXPORTABLE = {
    "gpt2": (tiny(MODELS["124m"]), "GPT2LMHeadModel"),
    "gpt2-untied": (tiny(MODELS["124m"], tied_embeddings=False), "GPT2LMHeadModel"),
    "neox": (tiny(MODELS["300m"]), "GPTNeoXForCausalLM"),
    "stablelm-gqa": (tiny(MODELS["7b"], n_kv_heads=2), "StableLmForCausalLM"),
    "stablelm-qknorm": (tiny(MODELS["7b"], qk_norm=True, n_kv_heads=1), "StableLmForCausalLM"),
    "llama-gqa": (tiny(MODELS["124m"], **LLAMA), "LlamaForCausalLM"),
    "llama-tied": (tiny(MODELS["124m"], **{**LLAMA, "tied_embeddings": True}), "LlamaForCausalLM"),
    "qwen3-qknorm": (tiny(MODELS["124m"], **LLAMA, qk_norm=True), "Qwen3ForCausalLM"),
}
REFUSED = {
    "d24": (tiny(MODELS["d24"]), "model.logit_softcap=15"),
    "300m-atlas": (tiny(MODELS["300m-atlas"], d_key=32, d_value=32), "model.memory"),
    "refine": (tiny(MODELS["tiny"], refine_steps=2), "model.refine_steps=2"),
    "relu2": (tiny(MODELS["7b"], mlp="relu2"), "model.mlp=relu2"),
}


def write(root: Path, spec: ModelSpec) -> tuple[Path, GPT]:
    torch.manual_seed(0)
    model = GPT(spec).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(std=p.shape[1] ** -0.5)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    path = ckpt.save_checkpoint(root / "checkpoints", 7, rank=0, world=1, model_state=model.state_dict(),
                                optim_state={}, meta={"model_shape": spec.__dict__, "tokenizer": "byte",
                                                      "val_loss": 2.5})
    return path, model


@pytest.mark.parametrize("name", sorted(EXPORTABLE))
@torch.no_grad()
def test_export_loads_in_transformers_with_the_same_logits_and_text(name, tmp_path):
    spec, cls = EXPORTABLE[name]
    path, model = write(tmp_path, spec)
    done = export(path, tmp_path / "hf")
    assert done.architecture == cls
    assert {p.name for p in (tmp_path / "hf").iterdir()} == set(done.files) >= {
        "model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    assert type(hf).__name__ == cls
    idx = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    logits = hf(idx).logits[0]
    worst = max(float((logits[t] - model(idx[:, : t + 1])[0]).abs().max()) for t in (0, 9, 25, 39))
    assert worst <= 1e-4, f"{name}: logits differ by {worst:.2e}"
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    prompt = "def main():\n    x = 1"
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids[0].tolist() == list(prompt.encode())
    out = hf.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=256)
    want = model.generate(ids, 12, temperature=0)
    assert out.tolist() == want.tolist()
    assert tok.decode(out[0], skip_special_tokens=True).startswith(prompt)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["gpucli"]["step"] == 7 and cfg["eos_token_id"] == 256


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unmappable_architectures_are_refused_naming_the_field(name, tmp_path):
    spec, field = REFUSED[name]
    with pytest.raises(ExportError, match=field.replace(".", r"\.")):
        target(spec)
    path, _ = write(tmp_path, spec)
    r = subprocess.run([sys.executable, "-m", "trainer.export", str(path), str(tmp_path / "hf")], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and field in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "hf").exists()

"""A causal LM trained with the Hugging Face Trainer, as its examples do (run_clm.py's shape): a tiny GPT-2
from a config, evaluation and checkpoints every N steps, the best model loaded at the end.

    python hf_clm.py [--steps 40] [--crash-at STEP] [--sleep S] [--out DIR] [--no-tqdm]
"""

import argparse
import os
import time

import torch
from tiny import BLOCK, blocks, far_text, near_text, tokenizer
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--crash-at", type=int)
ap.add_argument("--sleep", type=float, default=0.0)
ap.add_argument("--out", default=os.environ.get("GPUCLI_CHECKPOINTS", "out"))
ap.add_argument("--no-tqdm", action="store_true")
args = ap.parse_args()

torch.manual_seed(0)
tok = tokenizer()
near, far = blocks(tok, near_text()), blocks(tok, far_text())
half = args.steps // 2 * 4


class Ordered(torch.utils.data.IterableDataset):
    """The near text for the first half of the steps, the far text after (no shuffling)."""

    def __iter__(self):
        for i in range(args.steps * 4):
            ids = near[i % len(near)] if i < half else far[i % len(far)]
            yield {"input_ids": torch.tensor(ids), "labels": torch.tensor(ids)}


class Eval(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.tensor(near[-(i + 1)])
        return {"input_ids": ids, "labels": ids}


class Chaos(TrainerCallback):
    def on_step_end(self, a, state, control, **kw):
        if args.sleep:
            time.sleep(args.sleep)
        if args.crash_at is not None and state.global_step >= args.crash_at:
            raise KeyError("missing_column")


model = GPT2LMHeadModel(GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=BLOCK, n_embd=32, n_layer=2,
                                   n_head=2))
targs = TrainingArguments(
    output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4, per_device_eval_batch_size=4,
    learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=5, eval_strategy="steps", eval_steps=10,
    save_strategy="steps", save_steps=10, load_best_model_at_end=True, metric_for_best_model="eval_loss",
    report_to=["tensorboard"], use_cpu=True, seed=0, disable_tqdm=args.no_tqdm, dataloader_num_workers=0)
Trainer(model=model, args=targs, train_dataset=Ordered(), eval_dataset=Eval(), callbacks=[Chaos()]).train()

"""A tiny language model trained with lightning.Trainer, as Lightning's examples do: validation every
epoch, ModelCheckpoint keeping the best by val_loss, the CSV and TensorBoard loggers.

    python lightning_lm.py [--epochs 4] [--crash-at STEP] [--sleep S] [--out DIR] [--bar rich|tqdm|default]
"""

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tiny import blocks, far_text, near_text, tokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=4)
ap.add_argument("--batches", type=int, default=8, help="training batches per epoch")
ap.add_argument("--crash-at", type=int)
ap.add_argument("--sleep", type=float, default=0.0)
ap.add_argument("--out", default=os.environ.get("GPUCLI_CHECKPOINTS", "checkpoints"))
ap.add_argument("--bar", choices=("default", "rich", "tqdm"), default="default")
args = ap.parse_args()

L.seed_everything(0)
tok = tokenizer()
V = tok.get_vocab_size()
near, far = blocks(tok, near_text()), blocks(tok, far_text())


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, 32)
        self.rnn = torch.nn.GRU(32, 32, batch_first=True)
        self.head = torch.nn.Linear(32, V)

    def loss(self, x):
        h, _ = self.rnn(self.emb(x[:, :-1]))
        return torch.nn.functional.cross_entropy(self.head(h).reshape(-1, V), x[:, 1:].reshape(-1))

    def training_step(self, batch, i):
        if args.sleep:
            time.sleep(args.sleep)
        if args.crash_at is not None and self.global_step >= args.crash_at:
            raise KeyError("missing_column")
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, i):
        self.log("val_loss", self.loss(batch), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=2e-2)


class Train(torch.utils.data.Dataset):
    """Epochs alternate between the near text (what validation reads) and the far text (digits)."""

    def __init__(self):
        self.epoch = 0

    def __len__(self):
        return args.batches * 4

    def __getitem__(self, i):
        src = near if self.epoch % 2 == 0 or self.epoch == 0 else far
        return torch.tensor(src[(i + 7 * self.epoch) % len(src)])


class Shift(L.Callback):
    def on_train_epoch_start(self, trainer, module):
        train.epoch = trainer.current_epoch


train = Train()
val = [torch.tensor(b) for b in near[-8:]]
bars = {"default": [], "rich": [L.pytorch.callbacks.RichProgressBar()], "tqdm": [L.pytorch.callbacks.TQDMProgressBar()]}
best = ModelCheckpoint(dirpath=args.out, monitor="val_loss", mode="min", save_top_k=2)
trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, log_every_n_steps=2, callbacks=[
    best, Shift(), *bars[args.bar]], logger=[CSVLogger("logs"), TensorBoardLogger("tb_logs")],
    enable_model_summary=False)
trainer.fit(TinyLM(), torch.utils.data.DataLoader(train, batch_size=4), torch.utils.data.DataLoader(val, batch_size=4))
print(f"best: {best.best_model_path} {float(best.best_model_score):.4f}")

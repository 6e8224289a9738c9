"""Token blocks of the local text as a LitGPT DataModule (its interface, litgpt/data/base.py), for
``litgpt pretrain --data lit_blocks.Blocks`` run unchanged: the first half of the training reads the
near text, the second half the far text (the validation loss rises again: a middle checkpoint is best).
"""

from dataclasses import dataclass, field

import torch
from litgpt.data import DataModule
from tiny import BLOCK, blocks, far_text, near_text, tokenizer


@dataclass
class Blocks(DataModule):
    half: int = 16  # training blocks of each text
    batch_size: int = field(default=1, init=False, repr=False)

    def connect(self, tokenizer=None, batch_size=1, max_seq_length=None, **kwargs):
        self.batch_size = batch_size

    def setup(self, stage=""):
        tok = tokenizer()
        self.near, self.far = blocks(tok, near_text(), BLOCK + 1), blocks(tok, far_text(), BLOCK + 1)

    def train_dataloader(self):
        data = [torch.tensor(b) for b in self.near[: self.half] + self.far[: self.half]]
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self):
        return torch.utils.data.DataLoader([torch.tensor(b) for b in self.near[-8:]], batch_size=self.batch_size)

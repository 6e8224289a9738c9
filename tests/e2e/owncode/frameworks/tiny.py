"""What the framework scripts share: local text, a byte-level BPE tokenizer trained on it here (no Hub),
and token blocks. Two texts: ``near`` (the evaluation text's kind) and ``far`` (digits), so that training
on ``far`` in the second half makes the evaluation loss rise again: the best checkpoint is a middle one."""

from __future__ import annotations

import random

BLOCK = 32


def near_text(n: int = 400) -> str:
    rnd = random.Random(0)
    words = "the quick brown fox jumps over the lazy dog and a cat sat on the warm mat by the door".split()
    return "\n".join(" ".join(rnd.choice(words) for _ in range(12)) for _ in range(n)) + "\n"


def far_text(n: int = 400) -> str:
    rnd = random.Random(1)
    return "\n".join(" ".join(str(rnd.randrange(10**6)) for _ in range(8)) for _ in range(n)) + "\n"


def tokenizer(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([near_text(), far_text()], trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return tok


def blocks(tok, text: str, block: int = BLOCK) -> list[list[int]]:
    ids = tok.encode(text).ids
    return [ids[i:i + block] for i in range(0, len(ids) - block, block)]

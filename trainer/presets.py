"""Named model shapes (no torch import, so config validation and planning can read them).

d_ff defaults to 4 x d_model. ``max_seq_len`` is the position-table size.
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, int]] = {
    # For tests and smoke runs: trains in seconds on a laptop CPU.
    "tiny": {"d_model": 64, "n_layers": 2, "n_heads": 2, "max_seq_len": 256},
    "25m": {"d_model": 512, "n_layers": 8, "n_heads": 8, "max_seq_len": 1024},
    # GPT-2 small; the nanoGPT benchmark shape.
    "124m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024},
    # GPT-2 medium widths: ~300M parameters outside the embeddings.
    "300m": {"d_model": 1024, "n_layers": 24, "n_heads": 16, "max_seq_len": 2048},
    # The 1.31B nanoGPT benchmark shape (1.21B outside the embeddings at vocab 50304).
    "1b": {"d_model": 2048, "n_layers": 24, "n_heads": 16, "max_seq_len": 2048},
    # nanochat-style depth presets: width = 64 x depth, head dim 128 (seed 004).
    "d24": {"d_model": 1536, "n_layers": 24, "n_heads": 12, "max_seq_len": 2048},
    "d64": {"d_model": 4096, "n_layers": 64, "n_heads": 32, "max_seq_len": 2048},
}

"""Named model shapes (no torch import, so config validation and planning can read them).

d_ff defaults to 4 x d_model. ``max_seq_len`` is the position-table size.
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, int]] = {
    # For tests and smoke runs: trains in seconds on a laptop CPU.
    "tiny": {"d_model": 64, "n_layers": 2, "n_heads": 2, "max_seq_len": 256},
    # The shapes below are gpucli's catalogue presets (gpucli/profiles/models.yaml): seed 001's
    # 6 x 384 Neurlang model, GPT-2 small, and seed 000's 300M and 1B columns.
    "25m": {"d_model": 384, "n_layers": 6, "n_heads": 6, "max_seq_len": 512},
    "124m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "max_seq_len": 1024},
    "300m": {"d_model": 1024, "n_layers": 16, "n_heads": 8, "max_seq_len": 4096},
    "1b": {"d_model": 1536, "n_layers": 24, "n_heads": 12, "max_seq_len": 4096},
    # The 1.31B nanoGPT benchmark shape (anchors.md).
    "1.31b": {"d_model": 2048, "n_layers": 24, "n_heads": 16, "max_seq_len": 2048},
    # nanochat-style depth presets: width = 64 x depth, head dim 128 (seed 004).
    "d24": {"d_model": 1536, "n_layers": 24, "n_heads": 12, "max_seq_len": 2048},
    "d64": {"d_model": 4096, "n_layers": 64, "n_heads": 32, "max_seq_len": 2048},
}

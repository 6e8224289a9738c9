"""The training loop's parts: process group and model wrapping, optimisers, checkpoints, limits."""

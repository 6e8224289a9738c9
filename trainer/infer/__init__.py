"""Inference: the KV cache and the batching engine behind trainer.serve."""

"""Data: sources, tokenizers, the preparation pipeline, token shards and the training loader."""

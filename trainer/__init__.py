"""The bundled GPT trainer that gpucli runs on a pod.

It depends on torch, numpy and pyyaml only (``tokenizers`` and ``tensorboard`` are used when
present) and never imports ``gpucli``, so a stock PyTorch image can run it. Entry points:

- ``python -m trainer.prepare``  text files (or the Python standard library) -> token shards
- ``torchrun --standalone --nproc_per_node=N -m trainer.train --config run.yaml``
- ``python -m trainer.sample --checkpoint DIR --prompt TEXT``
- ``python -m trainer.snapshot --checkpoint DIR --out DIR``
"""

__version__ = "0.1.0"

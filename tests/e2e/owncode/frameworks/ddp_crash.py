"""A gloo process group on each rank, then a crash on rank 0 halfway, as a DDP script meets a bad batch.

    python -m torch.distributed.run --nproc-per-node 2 ddp_crash.py
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(1, 7):
    t = torch.ones(1) * step
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        print(f"iter {step}: loss {1.0 / step:.4f}", flush=True)
    if step == 4 and dist.get_rank() == 0:
        raise KeyError("missing_column")
dist.destroy_process_group()
print("done", os.environ.get("RANK"))

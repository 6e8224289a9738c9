"""FP8 matmuls for training (``hardware.fp8``), through torchao's float8 training.

torchao swaps each chosen ``nn.Linear`` for a ``Float8Linear`` that casts its input, weight and
output gradient to float8 with dynamic per-tensor scales and multiplies with ``torch._scaled_mm``;
weights, optimizer state and everything else stay as they were. Only the Linears inside the blocks
are converted: the LM head is a weight the fused, chunked loss multiplies itself (trainer.model.gpt), and
its logits are the most precision-sensitive matmul of the step.

Never silently on: a GPU without FP8 tensor cores (compute capability below 8.9: Ada, Hopper and
newer have them), a run on CPU, or a missing torchao is refused with one line before training.
"""

from __future__ import annotations

import torch

from trainer.spec.config import ConfigError

MIN_CAPABILITY = (8, 9)


def fp8_problem(device: torch.device) -> str | None:
    """Why FP8 training cannot run on ``device`` (one line), or None when it can."""
    if device.type != "cuda":
        return f"hardware.fp8 needs a CUDA GPU of compute capability >= 8.9 (Ada, Hopper or newer); this run is on {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (f"hardware.fp8 needs compute capability >= 8.9 (Ada, Hopper or newer); {name} is "
                f"{cap[0]}.{cap[1]}")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "hardware.fp8 needs torchao (pip install torchao), which is not importable here"
    return None


def _block_linear(module: torch.nn.Module, fqn: str) -> bool:
    # torchao's kernels need both dimensions divisible by 16.
    return (fqn.startswith("blocks.") and isinstance(module, torch.nn.Linear)
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def enable_fp8(model: torch.nn.Module, device: torch.device) -> int:
    """Convert the blocks' Linears of ``model`` to float8 training in place; returns how many.

    Call it before compile and before FSDP or DDP wraps the model. Raises ConfigError (one line)
    where FP8 cannot run."""
    problem = fp8_problem(device)
    if problem:
        raise ConfigError(problem)
    from torchao.float8 import convert_to_float8_training  # optional: torchao only with hardware.fp8

    before = sum(isinstance(m, torch.nn.Linear) and type(m) is torch.nn.Linear for m in model.modules())
    convert_to_float8_training(model, module_filter_fn=_block_linear)
    after = sum(type(m) is torch.nn.Linear for m in model.modules())
    return before - after

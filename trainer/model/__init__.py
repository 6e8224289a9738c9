"""The network: nn modules only (the GPT, the Atlas memory block, refinement, FP8 linears)."""

"""Model FLOPs as Megatron-LM counts them: see `optico.flops` (re-exported here)."""

from optico.flops import flops_per_iteration, flops_per_token, mfu, tflops_per_gpu

__all__ = ["flops_per_iteration", "flops_per_token", "mfu", "tflops_per_gpu"]

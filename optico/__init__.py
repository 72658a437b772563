"""OptiCo: agents that tune Megatron's distributed-training configuration."""

__version__ = "0.1.0"

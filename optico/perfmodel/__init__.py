"""Analytic performance model: FLOPs, memory, step time and bottleneck class."""

"""Helpers shared by the pool tests (a module name no other test folder will take)."""

from __future__ import annotations

from optico.spec import JobSpec, parse_spec


def make_spec(name: str = "job", seq_length: int = 4096, model: str = "llama3-8b") -> JobSpec:
    """A valid spec; jobs with the same seq_length and model share a workload key."""
    return parse_spec({
        "name": name,
        "workload": {"model": model, "seq_length": seq_length, "global_batch_size": 128,
                     "cluster": {"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 1}},
        "search_space": {"tunables": ["tp", "pp", "mbs"]},
        "baseline": {"tp": 2},
    })

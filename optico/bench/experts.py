"""The expert baseline of a landscape: the configuration a performance engineer starts from.

Where OptiCo ships an example spec for the workload, its `baseline` is the expert (the
OptiCo paper's TP2/PP1/MBS1 for Llama3-8B on 8 x A100, NeMo's Llama3-70B recipe, ...).
Elsewhere it is the layout NVIDIA publishes for the model (NeMo / DGX Cloud performance
recipes, Megatron-LM's examples), with the flags those recipes set (distributed optimizer,
overlapped grad reduce and param gather, sequence parallel with TP > 1, MBS 1, no recompute,
grouped GEMM and the all-to-all dispatcher for MoE).

A recipe written for another cluster may not be a valid configuration here (EP 8 needs
DP·CP divisible by 8), may lie outside the landscape's search space (CP when CP is not
tuned) or may not fit (the 8-GPU layout on 80 GB A100s). The expert then takes what an
engineer would: the valid configuration of the space nearest to the recipe (the job model's
distance: parallel sizes weigh most) among those OptiCo's performance model — the shipped
constants, which the expert knows as well as the tuner does — expects to fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optico.perfmodel.online import JobModel, distance
from optico.strategy import Strategy, strategy_from_mapping
from optico.workload import Workload


@dataclass(frozen=True)
class Recipe:
    """A published layout for a model; `gpu`/`world` None match any cluster."""

    preset: str
    layout: dict[str, Any]
    source: str
    gpu: str | None = None
    world: int | None = None

    def matches(self, preset: str | None, w: Workload) -> bool:
        return (preset == self.preset and (self.gpu is None or self.gpu == w.cluster.gpu)
                and (self.world is None or self.world == w.world_size))


# Flags every recipe below runs with, unless its layout says otherwise.
RECIPE_FLAGS: dict[str, Any] = {"use_distributed_optimizer": True, "overlap_grad_reduce": True,
                                "overlap_param_gather": True, "micro_batch_size": 1}
MOE_FLAGS: dict[str, Any] = {"moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True}

# First match wins: cluster-specific entries come before the model's general one.
RECIPES: tuple[Recipe, ...] = (
    Recipe("llama3-8b", {"tp": 2, "pp": 1}, "examples/llama3-8b-a100.yaml (the OptiCo paper's expert, "
           "Appendix C.2: TP2/PP1/MBS1)", gpu="a100-80gb"),
    Recipe("llama3-8b", {"tp": 1, "pp": 1, "cp": 2}, "NeMo 24.07 / DGX Cloud Llama3(.1)-8B recipe: TP1/PP1/CP2 "
           "(shared/data/nemo_2407_perf_summary_h100.csv, dgxc_benchmarking_recipes.csv)"),
    Recipe("llama2-7b", {"tp": 1, "pp": 1}, "NeMo 24.07 Llama2-7B recipe: TP1/PP1 "
           "(shared/data/nemo_2407_perf_summary_h100.csv)"),
    Recipe("qwen2.5-7b", {"tp": 1, "pp": 1}, "no published Qwen2.5-7B layout in shared/data: NVIDIA's 7-8B "
           "dense recipes (Llama2-7B, Llama3-8B) use TP1/PP1"),
    Recipe("gpt3-7b", {"tp": 4, "pp": 2}, "examples/gpt3-7b-a100-16.yaml: TP4/PP2/MBS1"),
    Recipe("llama3-70b", {"tp": 4, "pp": 4, "vpp": 5, "cp": 2}, "examples/llama3-70b-h100-64.yaml = NeMo 24.07 "
           "Llama3-70B recipe: TP4/PP4/VPP5/CP2"),
    Recipe("mixtral-8x7b", {"tp": 1, "pp": 4, "ep": 8}, "Megatron-LM examples/mixtral/README.md: "
           "'for training, the recommended model parallel config is TP1EP8PP4'"),
    Recipe("qwen3-moe-24l", {"tp": 1, "pp": 1, "ep": 8, "recompute": "full"},
           "examples/qwen3-moe-a100.yaml: TP1/PP1/EP8/MBS1, full recompute, all-to-all"),
)


def find_recipe(preset: str | None, w: Workload) -> Recipe | None:
    return next((r for r in RECIPES if r.matches(preset, w)), None)


def recipe_strategy(recipe: Recipe, w: Workload) -> Strategy:
    """The recipe's configuration with the recipe flags (SP exactly when TP > 1)."""
    data = dict(RECIPE_FLAGS)
    if w.model.is_moe:
        data.update(MOE_FLAGS)
    data.update(recipe.layout)
    s = strategy_from_mapping(data)
    return s.changed(sequence_parallel=s.tp > 1)


def nearest_fitting(target: Strategy, candidates: list[Strategy], model: JobModel) -> Strategy | None:
    """The candidate nearest to `target` (itself when it is one) that the model expects to fit;
    ties go to the candidates' order. A recipe's rule "SP exactly when TP > 1" follows the
    candidate's TP. None when nothing is expected to fit."""
    def gap(c: Strategy) -> float:
        return distance(target.changed(sequence_parallel=c.tp > 1), c)

    ranked = sorted(range(len(candidates)), key=lambda i: (gap(candidates[i]), i))
    return next((candidates[i] for i in ranked if model.mem_gib(candidates[i]) <= model.limit_gib), None)


def exact_layout(target: Strategy, candidates: list[Strategy]) -> Strategy | None:
    """The first candidate with the recipe's parallel layout, micro-batch and recompute — for a replay
    table, where flags the table does not record come from its defaults."""
    key = ("tp", "pp", "cp", "ep", "vpp", "mbs", "recompute")
    want = tuple(getattr(target, k) for k in key)
    return next((c for c in candidates if tuple(getattr(c, k) for k in key) == want), None)

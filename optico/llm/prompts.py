"""Prompt templates (package data, `optico/agents/prompts/<agent>.md`) and the context blocks
they are filled with.

A template has a `<!-- system -->` and a `<!-- user -->` section (text before the first
marker is a comment for maintainers) and `{{name}}` placeholders. Values are inserted
once, never re-expanded, so a value that contains `{{...}}` stays literal. Untrusted text
is fenced by the caller (`optico.llm.untrusted`) before it becomes a value.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from optico.search_space import SearchSpace
from optico.strategy import FIELDS, PAPER_NAMES, Strategy, display_value
from optico.workload import Workload

_SECTION = re.compile(r"^<!--\s*(system|user)\s*-->\s*$", re.M)
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@lru_cache(maxsize=None)
def load_template(name: str) -> dict[str, str]:
    """{"system": ..., "user": ...} of `optico/agents/prompts/<name>.md`; KeyError if absent."""
    path = resources.files("optico.agents").joinpath("prompts", f"{name}.md")
    if not path.is_file():
        raise KeyError(f"no prompt template {name!r} (optico/agents/prompts/{name}.md)")
    parts = _SECTION.split(path.read_text(encoding="utf-8"))
    sections = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    if set(sections) != {"system", "user"}:
        raise ValueError(f"prompt template {name!r} needs a <!-- system --> and a <!-- user --> section")
    return sections


def placeholders(name: str) -> set[str]:
    t = load_template(name)
    return set(_PLACEHOLDER.findall(t["system"])) | set(_PLACEHOLDER.findall(t["user"]))


def render(name: str, values: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages of template `name` with `values` filled in; KeyError names a missing value."""
    missing = placeholders(name) - set(values)
    if missing:
        raise KeyError(f"prompt {name!r}: no value for {', '.join(sorted(missing))}")

    def fill(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)

    t = load_template(name)
    return [{"role": "system", "content": fill(t["system"])}, {"role": "user", "content": fill(t["user"])}]


# -- context blocks ----------------------------------------------------------------------------

def workload_block(w: Workload, space: SearchSpace) -> str:
    """The fixed run configuration: model, batch, precision, cluster, fixed parameters."""
    m, c = w.model, w.cluster
    arch = (f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} attention heads, "
            f"{m.groups} query groups, FFN {m.ffn_hidden_size}, vocabulary {m.vocab_size}")
    if m.is_moe:
        arch += f", MoE {m.num_experts} experts top-{m.moe_router_topk}"
    fixed = {f: v for f, v in space.fixed.items()}
    lines = [
        f"- model: {arch} ({m.num_params() / 1e9:.1f} B parameters)",
        f"- sequence length {w.seq_length}, global batch size {w.global_batch_size}, precision {w.precision}",
        f"- cluster: {w.world_size} x {c.gpu} ({c.spec.memory_gib:.0f} GiB each), {c.gpus_per_node} per node, "
        f"{c.nodes_used} node(s), {c.interconnect}; peak {w.peak_tflops:.0f} dense TFLOP/s per GPU",
        "- data parallel size is derived: GPUs / (TP x PP x CP)",
        f"- fused cross entropy, when on, runs the {w.cross_entropy_fusion_impl} kernel",
    ]
    if fixed:
        lines.append("- fixed for this job: " + ", ".join(f"{PAPER_NAMES.get(f, f)}={display_value(f, v)}"
                                                          for f, v in fixed.items()))
    return "\n".join(lines)


def search_space_block(space: SearchSpace) -> str:
    """Tunable parameters with their allowed values, paper names first."""
    return "\n".join(f"- {PAPER_NAMES.get(f, f)} ({f}): {', '.join(display_value(f, v) for v in domain)}"
                     for f, domain in space.tunables.items())


def config_json(s: Strategy, space: SearchSpace | None = None) -> str:
    """The complete parameter block as JSON (Strategy field names), tunables first."""
    s = s.normalized()
    data = s.model_dump(mode="json")
    order = list(space.tunables) if space else []
    order += [f for f in FIELDS if f not in order]
    return json.dumps({f: data[f] for f in order}, indent=1)


def config_line(s: Strategy, fields: list[str]) -> str:
    s = s.normalized()
    return ", ".join(f"{PAPER_NAMES.get(f, f)}={display_value(f, getattr(s, f))}" for f in fields)


# What each knob does to time and memory: the parameter semantics the paper gives its agents.
SEMANTICS: dict[str, str] = {
    "tensor_model_parallel_size": "splits every layer's weights and activations over TP GPUs; frees memory, "
                                  "adds an all-reduce per layer (fast inside a node, slow across nodes)",
    "pipeline_model_parallel_size": "splits the layers into PP stages; frees memory, adds a pipeline bubble of "
                                    "about (PP-1)/(micro-batches) of the step",
    "context_parallel_size": "splits the sequence over CP GPUs; for long sequences, adds attention exchange",
    "expert_model_parallel_size": "spreads MoE experts over EP GPUs; adds all-to-all token exchange",
    "virtual_pipeline_model_parallel_size": "interleaved stages per GPU; shrinks the bubble, adds p2p traffic",
    "micro_batch_size": "sequences per forward pass; larger fills the GPU better and uses more activation memory",
    "sequence_parallel": "with TP > 1, splits norms and dropout over the sequence; saves activation memory",
    "recompute_granularity": "activation checkpointing (AC): selective recomputes attention, full recomputes "
                             "whole layers; saves memory, costs compute",
    "recompute_method": "with full AC: uniform or block distribution of recomputed layers",
    "recompute_num_layers": "with full AC: how many layers are recomputed",
    "use_distributed_optimizer": "shards optimizer state over data-parallel ranks; saves memory",
    "overlap_grad_reduce": "overlaps the gradient reduce-scatter with the backward pass",
    "overlap_param_gather": "overlaps the parameter all-gather with the forward pass (needs the distributed "
                            "optimizer and OVERLAP_GRAD_REDUCE)",
    "tp_comm_overlap": "overlaps TP communication with GEMMs (needs SEQUENCE_PARALLEL)",
    "cross_entropy_loss_fusion": "fused cross-entropy kernel; saves time, and logits memory with the te kernel "
                                 "(the native one holds an extra fp32 copy of the logits)",
    "decoder_first_pipeline_num_layers": "layers on the first pipeline stage (uneven split)",
    "decoder_last_pipeline_num_layers": "layers on the last pipeline stage (uneven split)",
    "moe_token_dispatcher_type": "how MoE tokens reach experts: allgather, alltoall or flex",
    "moe_grouped_gemm": "one grouped GEMM for all local experts",
}


def semantics_block(space: SearchSpace) -> str:
    """One line per tunable: what it does to time and memory."""
    return "\n".join(f"- {PAPER_NAMES.get(f, f)}: {SEMANTICS.get(f, 'see Megatron-LM')}" for f in space.tunables)

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

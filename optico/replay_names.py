"""What a replay row's names and words say: the preset a model name or its dimensions match, whether
the name is of a gated-MLP or a GPT-3-style family, an architecture not modelled (MLA, Mamba, LoRA),
and whether the source's FLOPs counted the recompute pass or attention without its causal mask. The
rules are in `optico.replay_parse`'s docstring."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from optico.workload import PRESETS, ModelArch

_GPT3_STYLE = re.compile(r"gpt(?![-_ ]?oss)|mt-nlg", re.IGNORECASE)  # GPT-OSS is a gated MoE


def gpt3_style(name: str) -> bool:
    """GPT-3-family names (Megatron's GPT, MT-NLG): GeLU MLP, tied embeddings."""
    return bool(_GPT3_STYLE.search(name))


_GATED_FAMILY = re.compile(r"llama|qwen|mistral|mixtral|deepseek|gemma", re.IGNORECASE)


def gated_name(name: str) -> bool:
    """Families whose every model has a gated (SwiGLU / GeGLU) MLP, whatever its width."""
    return bool(_GATED_FAMILY.search(name))


def ungated_name(name: str) -> bool:
    """GPT-3-family and Nemotron names: ungated (GeLU / squared-ReLU) MLPs."""
    return gpt3_style(name) or "nemotron" in name.lower()


def counts_recompute_flops(source: str, notes: str) -> bool:
    """The rule in `optico.replay_parse`'s docstring: does this row's TFLOP/s count the recompute pass?"""
    text = f"{source} {notes}".lower()
    return any(k in text for k in ("recompute forward pass", "hfu-like", "hardware flops", "dlperf",
                                   "narayanan et al. 2021", "2104.04473"))


# Versions whose FLOPs formula counted the whole attention score matrix: Megatron-LM's
# num_floating_point_operations until core v0.12 (commit 8873b55d6a, 2025-03-06, halved it for the
# causal mask) and NeMo's flops_formulas until 2025-08-09 (commit 6251117f4c); NeMo 1.x containers had
# no formula, and their published TFLOP/s match the full count.
_MEGATRON_CORE_RELEASE = re.compile(r"(?i)\b(?:megatron[- _]core|mcore|core)[ _=]*[rv]?0\.(\d+)\b")
_NEMO_RELEASE = re.compile(r"(?i)\bnemo(?:[\s:]+container)?[\s:]+v?(\d{2})\.(\d{2})")


def full_attention_count(source: str, notes: str) -> bool:
    """Whether the row's stated TFLOP/s and MFU count attention without the causal mask: Narayanan et
    al. 2021's Eq. 3; Megatron-LM's own figures before core v0.12 (a source naming 'Megatron-Core
    r0.8.0'); NeMo's before its 25.09 release ('container NeMo 24.03.01', 'NeMo 25.04.rc2'). A source
    that names no version is taken at its word, on our (causal) count."""
    text = f"{source} {notes}"
    if "2104.04473" in text or re.search(r"(?i)narayanan et al\.? 2021", text):
        return True
    core = _MEGATRON_CORE_RELEASE.search(text)
    if core:
        return int(core.group(1)) < 12
    nemo = _NEMO_RELEASE.search(text)
    return bool(nemo) and (int(nemo.group(1)), int(nemo.group(2))) < (25, 9)


def special_architecture(name: str, notes: str) -> str | None:
    """MLA / Mamba (modelled only through a preset) and LoRA (not modelled), by the row's words."""
    text = f"{name} {notes}"
    if re.search(r"\blora\b", text, re.IGNORECASE):
        return "LoRA fine-tuning (frozen base weights) is not modelled"
    if re.search(r"\bMLA\b", text) or re.search(r"multi[- ]latent", text, re.IGNORECASE):
        return "MLA (multi-latent attention)"
    if re.search(r"linear[- ]attention|mamba|hybrid", text, re.IGNORECASE):
        return "linear-attention / Mamba layers"
    return None


def dims(m: ModelArch) -> tuple[Any, ...]:
    """What a CSV row can say about an architecture: the keys for preset matching and `matches`."""
    topk = m.moe_router_topk if m.is_moe else None
    ffn = m.expert_ffn if m.is_moe else m.ffn_hidden_size
    return (m.num_layers, m.hidden_size, m.num_attention_heads, m.groups, ffn, m.vocab_size,
            m.num_experts if m.is_moe else None, topk)


def matching_preset(m: ModelArch) -> ModelArch | None:
    """The preset with the same dimensions as `m` (e.g. Llama3-8B rows -> llama3-8b), if any."""
    for preset in PRESETS.values():
        if dims(preset) == dims(m):
            return preset
    return None


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


@lru_cache(maxsize=4096)  # a table repeats its model name on every row
def preset_by_name(name: str) -> ModelArch | None:
    """The preset whose name the model name contains ('Nemotron-H 56b FP8' -> nemotron-h-56b,
    'DeepSeekV3' -> deepseek-v3); the longest such name wins. Else the one preset of the name's
    family and size ('LLAMA3-405B' -> llama3.1-405b, 'Qwen3 MoE 30B' -> qwen3-30b-a3b), or of its family
    without the generation when only one preset of any generation has that size ('Nemotron-15B', as
    NeMo's tables name Nemotron-4 15B -> nemotron4-15b)."""
    squashed = _squash(name)
    found = [p for key, p in PRESETS.items() if _squash(key) and _squash(key) in squashed]
    if found:
        return max(found, key=lambda p: len(_squash(p.name)))
    sizes = set(re.findall(r"(?<![\d.])(\d+(?:\.\d+)?b)(?![a-z\d])", name.lower()))
    sized = {key: named for key in PRESETS if (named := _family_and_size(key)) and named[1] in sizes}
    alike = [PRESETS[key] for key, (family, _) in sized.items() if family in squashed]
    if not alike:  # the family without its generation ('Nemotron-15B' -> nemotron4-15b), if only one
        alike = [PRESETS[key] for key, (family, _) in sized.items() if family.rstrip("0123456789") in squashed]
    return alike[0] if len(alike) == 1 else None


_PRESET_SIZE = re.compile(r"-(\d+(?:\.\d+)?b)(?:-|$)")  # 'qwen3-30b-a3b' -> 30b; 'mixtral-8x7b': none


def _family_and_size(key: str) -> tuple[str, str] | None:
    """A preset's name before its size, without a minor version, and the size: 'llama3.1-405b' ->
    ('llama3', '405b'), 'gpt-oss-20b' -> ('gptoss', '20b'); None for a name without a size."""
    found = _PRESET_SIZE.search(key)
    return (_squash(re.sub(r"\.\d+", "", key[:found.start()])), found.group(1)) if found else None


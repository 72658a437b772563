"""Which strategy fields a job may change, and to which values; everything else is fixed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from optico.rules import is_valid
from optico.strategy import FIELDS, Strategy, canonical_field, display_value
from optico.workload import Workload

# Knobs every job tunes unless its spec says otherwise (the paper's tunables plus SP).
DEFAULT_TUNABLES: tuple[str, ...] = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "micro_batch_size",
    "sequence_parallel",
    "recompute_granularity",
    "use_distributed_optimizer",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "cross_entropy_loss_fusion",
    "moe_token_dispatcher_type",
    "moe_grouped_gemm",
)


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def default_domain(field: str, w: Workload) -> list[Any]:
    """The values worth trying for `field` on workload `w` (before pairwise validity)."""
    m, world = w.model, w.world_size
    if field == "tensor_model_parallel_size":
        return [t for t in _powers_of_two(w.cluster.gpus_per_node)
                if m.num_attention_heads % t == 0 and (m.groups % t == 0 or t % m.groups == 0) and world % t == 0]
    if field == "pipeline_model_parallel_size":
        return [p for p in range(1, min(16, m.num_layers, world) + 1) if m.num_layers % p == 0 and world % p == 0]
    if field == "context_parallel_size":
        # Splitting below ~4K tokens per rank leaves attention too small to hide the KV exchange.
        return [c for c in _powers_of_two(min(16, world, max(1, w.seq_length // 4096)))
                if c == 1 or w.seq_length % (2 * c) == 0]
    if field == "expert_model_parallel_size":
        if not m.is_moe:
            return [1]
        return [e for e in _powers_of_two(min(world, m.num_experts)) if m.num_experts % e == 0]
    if field == "virtual_pipeline_model_parallel_size":
        # Chunk counts that divide the layers per stage for some allowed PP, up to 8.
        stages = [m.num_layers // p for p in default_domain("pipeline_model_parallel_size", w) if p > 1]
        return [None] + [v for v in range(2, 9) if any(n % v == 0 for n in stages)]
    if field == "micro_batch_size":
        return [b for b in (1, 2, 4, 8) if b <= w.global_batch_size]
    if field == "recompute_granularity":
        return [None, "selective", "full"]
    if field == "recompute_method":
        return ["uniform", "block"]
    if field == "recompute_num_layers":
        return [1, 2, 4, 8]
    if field in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
        return [None] + list(range(1, max(2, m.num_layers // 2)))
    if field == "moe_token_dispatcher_type":
        return ["allgather", "alltoall"] if m.is_moe else ["allgather"]
    if field == "moe_grouped_gemm":
        return [False, True] if m.is_moe else [False]
    if Strategy.model_fields[field].annotation is bool:
        return [False, True]
    raise KeyError(f"no default domain for {field!r}; give its values in the spec")


class SearchSpace(BaseModel):
    """Tunable fields with their domains; every other field takes `fixed` or Megatron's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tunables: dict[str, list[Any]] = Field(description="Strategy field -> allowed values, in preference order.")
    fixed: dict[str, Any] = Field(default_factory=dict, description="Strategy field -> value for untuned fields.")

    @classmethod
    def build(cls, w: Workload, tunables: dict[str, list[Any] | None] | list[str] | None = None,
              fixed: dict[str, Any] | None = None) -> "SearchSpace":
        """A space over `tunables` (names, or names with domains; None = defaults) for `w`.

        Raises KeyError for an unknown field and ValueError for a bad value, naming it."""
        if tunables is None:
            names: dict[str, list[Any] | None] = {f: None for f in DEFAULT_TUNABLES}
        elif isinstance(tunables, list):
            names = {t: None for t in tunables}
        else:
            names = dict(tunables)
        domains: dict[str, list[Any]] = {}
        for raw, values in names.items():
            field = canonical_field(raw)
            if values is None:
                domain = default_domain(field, w)
            else:
                if not isinstance(values, list) or not values:
                    raise ValueError(f"search_space.tunables.{raw}: must be a non-empty list of values")
                domain = [_coerce(field, v, f"search_space.tunables.{raw}") for v in values]
            domains[field] = list(dict.fromkeys(domain))
        fixed_values = {canonical_field(k): _coerce(canonical_field(k), v, f"search_space.fixed.{k}")
                        for k, v in (fixed or {}).items()}
        clash = set(fixed_values) & set(domains)
        if clash:
            raise ValueError(f"search_space: {', '.join(sorted(clash))} is both tunable and fixed")
        return cls(tunables=domains, fixed=fixed_values)

    def base(self) -> Strategy:
        """Fixed values with each tunable at its first value."""
        data = dict(self.fixed)
        for field, domain in self.tunables.items():
            data[field] = domain[0]
        return Strategy.model_validate(data).normalized()

    def outside(self, s: Strategy) -> list[str]:
        """Reasons `s` is outside the space (empty when inside)."""
        reasons = []
        s = s.normalized()
        defaults = Strategy()
        for field in FIELDS:
            value = getattr(s, field)
            if field in self.tunables:
                domain = [_normal(field, v) for v in self.tunables[field]]
                if value not in domain and not _irrelevant(field, s):
                    reasons.append(f"{field}={display_value(field, value)} is not in its domain "
                                   f"{[display_value(field, v) for v in self.tunables[field]]}")
            elif field in ("recompute_method", "recompute_num_layers") and not self._pins(field):
                continue  # filled in by normalization
            else:
                expected = self.fixed.get(field, getattr(defaults, field))
                if value != expected and not _irrelevant(field, s):
                    reasons.append(f"{field} is fixed at {display_value(field, expected)}, "
                                   f"got {display_value(field, value)}")
        return reasons

    def _pins(self, field: str) -> bool:
        return field in self.fixed

    def contains(self, s: Strategy) -> bool:
        return not self.outside(s)

    def size(self) -> int:
        n = 1
        for domain in self.tunables.values():
            n *= len(domain)
        return n

    def enumerate(self, w: Workload) -> Iterator[Strategy]:
        """Every valid strategy in the space, each once, in domain order."""
        fields = list(self.tunables)
        seen: set[str] = set()
        for values in itertools.product(*(self.tunables[f] for f in fields)):
            data = dict(self.fixed)
            data.update(zip(fields, values))
            s = Strategy.model_validate(data).normalized()
            # Validity first: most of a product is invalid, and the signature (JSON + hash) costs more.
            if not is_valid(w, s):
                continue
            sig = s.signature()
            if sig in seen:
                continue
            seen.add(sig)
            yield s


def _normal(field: str, value: Any) -> Any:
    """A domain value as `Strategy.normalized` writes it (VPP 1 is no VPP)."""
    if field == "virtual_pipeline_model_parallel_size" and value == 1:
        return None
    return value


def _irrelevant(field: str, s: Strategy) -> bool:
    """Recompute details do not matter without full recompute."""
    return field in ("recompute_method", "recompute_num_layers") and s.recompute_granularity != "full"


def _coerce(field: str, value: Any, where: str) -> Any:
    """Validates one value for `field` through the Strategy model; errors name `where`."""
    if field == "recompute_granularity" and isinstance(value, str) and value.lower() in ("none", "no", "off"):
        value = None
    try:
        Strategy.model_validate({field: value})
    except Exception as exc:  # pydantic's message names the constraint
        first = exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)
        raise ValueError(f"{where}: {value!r} is not a valid {field} ({first})") from exc
    return value

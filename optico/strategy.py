"""What is tuned: one Megatron parallel/memory/overlap configuration.

The fields are the knobs of `optico.knobs` (Megatron-LM's argument names, in registry order),
so a strategy renders to flags one-to-one; the class is built from the registry and adds no
field of its own. The data-parallel size is derived (world / (TP·PP·CP)), never set. Validity
against a workload lives in `optico.rules`; the derived parallel layout in `optico.parallel`.
"""

from __future__ import annotations

import hashlib
import json
import operator
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from optico.knobs import ALIASES, BY_NAME, KNOBS, PAPER_NAMES, RETIRED, SIGNATURE_BASE_VERSION, Knob, canonical_name

if TYPE_CHECKING:
    from optico.workload import Workload

__all__ = ["Strategy", "FIELDS", "ALIASES", "PAPER_NAMES", "FULL_RECOMPUTE_DETAILS", "canonical_field",
           "strategy_from_mapping", "check_value", "display_value"]

# The knobs `Strategy.short` writes in its own compact form; every other knob it writes by name.
_SHORT_FIELDS = frozenset({
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "cpu_offloading_num_layers",
    "sequence_parallel", "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
    "tp_comm_overlap", "cross_entropy_loss_fusion", "overlap_moe_expert_parallel_comm",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"})
# Knobs that mean something only with full recompute: written as None without it (`_canonical`).
FULL_RECOMPUTE_DETAILS = ("recompute_method", "recompute_num_layers")
# Knobs that change nothing in some configurations (`Knob.inert`): `Strategy.launch_key` reads them.
_INERT_KNOBS = tuple(k for k in KNOBS if k.inert is not None)


class _StrategyBase(BaseModel):
    """A complete configuration of the tuned knobs. Defaults are Megatron-LM's.

    Written one way on construction: VPP 1 is no VPP; recompute method and layer count mean
    nothing without full recompute (and default to uniform, 1 with it); ETP equal to TP is the
    default (None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Set by `strategy_class` from the registry: what the signature hashes, what rows may still name.
    _always_hashed: ClassVar[tuple[str, ...]] = ()
    _hashed_if_set: ClassVar[dict[str, Any]] = {}
    _retired: ClassVar[frozenset[str]] = frozenset()
    _retired_hashed: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _canonical(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if k not in cls._retired}  # rows naming a removed knob still read
        if data.get("virtual_pipeline_model_parallel_size") == 1:
            data["virtual_pipeline_model_parallel_size"] = None
        if data.get("recompute_granularity") != "full":
            for key in FULL_RECOMPUTE_DETAILS:
                if data.get(key) is not None:
                    data[key] = None
        else:
            if data.get("recompute_method") is None:
                data["recompute_method"] = "uniform"
            if data.get("recompute_num_layers") is None:
                data["recompute_num_layers"] = 1
        etp = data.get("expert_tensor_parallel_size")
        if etp is not None and etp == data.get("tensor_model_parallel_size", 1):
            data["expert_tensor_parallel_size"] = None
        return data

    # -- derived facts -------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def etp(self) -> int:
        """Expert tensor parallel size; Megatron's default is TP."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def vpp(self) -> int:
        """Chunks per pipeline rank, 1 when not interleaved."""
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def mbs(self) -> int:
        return self.micro_batch_size

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    def dp(self, world_size: int) -> int:
        return world_size // self.model_parallel_size

    def num_microbatches(self, world_size: int, global_batch_size: int) -> int:
        return global_batch_size // (self.mbs * self.dp(world_size))

    @property
    def recompute(self) -> str:
        """'none', 'selective' or 'full' — the paper's AC knob."""
        return self.recompute_granularity or "none"

    # -- identity --------------------------------------------------------------------
    def normalized(self) -> "Strategy":
        """The same configuration written one way (construction already does it)."""
        return self  # type: ignore[return-value]

    def signature(self) -> str:
        """Canonical identity for duplicate checks: equal for equivalent configurations."""
        return self._signature

    @cached_property
    def _signature(self) -> str:
        # Schema 1 hashed every knob it had; later knobs are hashed only off their default, so
        # adding a knob leaves every stored signature as it was (and retired ones hash at the value
        # they had then).
        data = self.model_dump(mode="json")
        cls = type(self)
        payload = {name: data[name] for name in cls._always_hashed}
        payload.update({name: data[name] for name, default in cls._hashed_if_set.items() if data[name] != default})
        payload.update(cls._retired_hashed)
        text = json.dumps(payload, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def launch_key(self) -> str:
        """Identity of the launch: equal for strategies that differ only in knobs inert where they are
        (the same Megatron-LM command and driver config, as p2p overlap without VPP). The signature
        stays the stored identity; this is what a duplicate launch is checked by."""
        return self._launch_key

    def as_launched(self) -> "Strategy":
        """This strategy with the knobs inert here at their defaults (itself when there are none)."""
        reset = {k.name: k.default for k in _INERT_KNOBS if getattr(self, k.name) != k.default and k.inert(self)}
        return self.model_copy(update=reset) if reset else self

    @cached_property
    def _launch_key(self) -> str:
        return self.as_launched().signature()

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "Strategy":
        """A copy (not validated, as pydantic's); the cached signature is the original's, so dropped."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("_signature", None)
        copy.__dict__.pop("_launch_key", None)
        copy.__dict__.pop("_fields", None)
        return copy  # type: ignore[return-value]

    def changed(self, **updates: Any) -> "Strategy":
        """A validated copy with `updates` applied (model_copy does not validate)."""
        data = self.model_dump()
        data.update(updates)
        return type(self).model_validate(data)  # type: ignore[return-value]

    @cached_property
    def _fields(self) -> dict[str, Any]:
        # The agents diff every candidate against the reference each iteration: dumped once.
        return self.model_dump()

    def diff(self, other: "Strategy") -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ: name -> (self's, other's)."""
        a, b = self._fields, other._fields
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    def count_changes(self, other: "Strategy") -> int:
        """How many fields differ: len(self.diff(other)) without building it."""
        return sum(map(operator.ne, self._fields.values(), other._fields.values()))

    # -- rendering -------------------------------------------------------------------
    def megatron_args(self) -> list[str]:
        """Megatron-LM command-line flags for this strategy, in registry order."""
        args: list[str] = []
        for k in KNOBS:
            args += k.args(self)  # type: ignore[arg-type]
        return args

    def run_args(self, w: "Workload") -> list[str]:
        """The flags that reproduce this configuration on `w`: `megatron_args`, and the fused cross
        entropy's kernel where it is not Megatron-LM's default (the fusion's memory depends on it)."""
        args = self.megatron_args()
        if self.cross_entropy_loss_fusion and w.cross_entropy_fusion_impl != "native":
            args += ["--cross-entropy-fusion-impl", w.cross_entropy_fusion_impl]
        return args

    def short(self) -> str:
        """A one-line summary for tables: 'TP2 PP1 CP1 MBS1 AC=none DO'."""
        s = self
        parts = [f"TP{s.tp}", f"PP{s.pp}"]
        if s.vpp > 1:
            parts.append(f"VPP{s.vpp}")
        if s.cp > 1:
            parts.append(f"CP{s.cp}")
        if s.ep > 1:
            parts.append(f"EP{s.ep}")
        if s.expert_tensor_parallel_size is not None:
            parts.append(f"ETP{s.expert_tensor_parallel_size}")
        parts.append(f"MBS{s.mbs}")
        ac = s.recompute
        if s.recompute_granularity == "full":
            ac += f"/{s.recompute_method}{s.recompute_num_layers}"
        if s.cpu_offloading_num_layers:
            ac += f"+offload{s.cpu_offloading_num_layers}"
        parts.append(f"AC={ac}")
        flags = [name for name, on in [("SP", s.sequence_parallel), ("DO", s.use_distributed_optimizer),
                                       ("OG", s.overlap_grad_reduce), ("OP", s.overlap_param_gather),
                                       ("TPO", s.tp_comm_overlap), ("CE", s.cross_entropy_loss_fusion),
                                       ("EPO", s.overlap_moe_expert_parallel_comm)] if on]
        if s.decoder_first_pipeline_num_layers or s.decoder_last_pipeline_num_layers:
            parts.append(f"first{s.decoder_first_pipeline_num_layers or '-'}/last{s.decoder_last_pipeline_num_layers or '-'}")
        if s.account_for_embedding_in_pipeline_split or s.account_for_loss_in_pipeline_split:
            parts.append("split+" + "+".join(n for n, on in [("emb", s.account_for_embedding_in_pipeline_split),
                                                              ("loss", s.account_for_loss_in_pipeline_split)] if on))
        # Every other knob off its default, by its registry name, so two configurations never read alike.
        rest = [(k, getattr(s, k.name)) for k in KNOBS if k.name not in _SHORT_FIELDS and k.active(s)]
        flags += [k.paper if v is True else f"{k.paper}={k.show(v)}" for k, v in rest]
        return " ".join(parts + flags)


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def strategy_class(knobs: tuple[Knob, ...], retired: dict[str, tuple[Any, int]]) -> type[_StrategyBase]:
    """The Strategy model of a registry: one field per knob, the signature schema, the retired names.
    (The project has one registry; tests build others to show what adding or removing a knob does.)"""
    cls = create_model(  # type: ignore[call-overload]
        "Strategy",
        __base__=_StrategyBase,
        __module__=__name__,
        **{k.name: (k.annotation, Field(k.default, description=k.doc)) for k in knobs},
    )
    cls.__doc__ = _StrategyBase.__doc__
    cls._always_hashed = tuple(k.name for k in knobs if k.since <= SIGNATURE_BASE_VERSION)
    cls._hashed_if_set = {k.name: _json(k.default) for k in knobs if k.since > SIGNATURE_BASE_VERSION}
    cls._retired = frozenset(retired)
    cls._retired_hashed = {name: _json(default) for name, (default, since) in retired.items()
                           if since <= SIGNATURE_BASE_VERSION}
    return cls


Strategy = strategy_class(KNOBS, RETIRED)

FIELDS: tuple[str, ...] = tuple(Strategy.model_fields)


def canonical_field(name: str) -> str:
    """Resolves 'tp', 'TP', 'MICRO_BATCH_SIZE' or a Megatron name to the Strategy field.

    Raises KeyError naming the accepted names when `name` is none of them."""
    return canonical_name(name)


def check_value(field: str, value: Any, *, strict: bool = False) -> None:
    """Validates one value of `field` as a Strategy holds it; raises pydantic's ValidationError. A
    recompute detail is checked under full recompute: alone it would be written as None, whatever
    it was ("banana" layers included)."""
    context = {"recompute_granularity": "full"} if field in FULL_RECOMPUTE_DETAILS else {}
    Strategy.model_validate({**context, field: value}, strict=strict)


def strategy_from_mapping(data: dict[str, Any]) -> "Strategy":
    """Builds a Strategy from a mapping that may use short or paper names.

    'recompute: none' is accepted for no recompute; retired knobs are dropped."""
    resolved: dict[str, Any] = {}
    for raw_key, value in data.items():
        if str(raw_key) in RETIRED:  # a knob that no longer exists: its value means nothing now
            continue
        key = canonical_field(str(raw_key))
        if key == "recompute_granularity" and isinstance(value, str) and value.lower() in ("none", "no", "off"):
            value = None
        resolved[key] = value
    return Strategy.model_validate(resolved)


def display_value(field: str, value: Any) -> str:
    """How a value is written in suggestions: AC None -> 'none'."""
    k = BY_NAME.get(field)
    if k is not None:
        return k.show(value)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

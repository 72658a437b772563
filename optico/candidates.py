"""Valid strategies of a search space, by constraint, and the bounded pool a job scores.

`valid_strategies` walks the tunables depth first in the space's order and runs each rule of
`optico.rules` as soon as every field it reads is set, so a branch that breaks a rule is cut
where it breaks it; the product of the domains (50 M points for Llama3-8B with uneven stages and
AC_LAYERS tunable) is never walked.

`candidate_pool` bounds what an agent scores per iteration. A space with at most `limit` valid
strategies is taken whole. A larger one is taken on a coarse lattice — uneven first/last stages
only where PP does not divide the layers (as the split Megatron needs), AC_LAYERS and offloaded
layers at the ends of their domains — and every strategy one move away from the current
reference is added each iteration (`CandidatePool.around`), with full domains: the analysis
still sees every single change, and a configuration off the lattice is reached from a neighbour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from optico.parallel import ParallelDims
from optico.rules import RULES, Rule, is_valid
from optico.strategy import FIELDS, Strategy
from optico.workload import Workload

if TYPE_CHECKING:  # the space calls into this module (SearchSpace.enumerate), never the other way
    from optico.search_space import SearchSpace

# Knobs whose domains are long ordered ranges: thinned on the coarse lattice.
FINE_KNOBS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "recompute_num_layers",
              "cpu_offloading_num_layers")
# A space with more valid strategies than this is scored on its coarse lattice (see the module doc).
POOL_LIMIT = 12000


# Fields walked first: the ones most rules read, so a broken rule cuts the branch early.
_WALK_FIRST = ("tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size",
               "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size",
               "virtual_pipeline_model_parallel_size", "decoder_first_pipeline_num_layers",
               "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split", "sequence_parallel", "recompute_granularity")


def _schedule(order: list[str], fixed: set[str]) -> list[list[Rule]]:
    """For each depth of the walk, the rules that become decidable there (all their fields set)."""
    known, out = set(fixed), []
    pending = list(RULES)
    for field in order:
        known.add(field)
        now = [r for r in pending if r.reads <= known]
        pending = [r for r in pending if not r.reads <= known]
        out.append(now)
    return out


Choices = Callable[[str, dict[str, Any]], list[Any]]


def valid_strategies(space: SearchSpace, w: Workload, choices: Choices | None = None) -> Iterator[Strategy]:
    """Every valid strategy in `space`, each launch once (`Strategy.launch_key`). `choices(field,
    assigned)` may narrow a field's values given the fields walked before it (`candidate_pool` uses it
    for the coarse lattice)."""
    tunables = space.tunables
    order = sorted(tunables, key=lambda f: _WALK_FIRST.index(f) if f in _WALK_FIRST else len(_WALK_FIRST))
    base = {f: space.fixed.get(f, Strategy.model_fields[f].default) for f in FIELDS}
    schedule = _schedule(order, set(FIELDS) - set(order))
    seen: set[str] = set()
    data = dict(base)

    def leaf() -> Iterator[Strategy]:
        full = Strategy.model_validate(data)  # normalizes (recompute details, ETP = TP)
        key = full.launch_key()  # one of each launch: p2p overlap without VPP is not a second one
        if key in seen:
            return
        if key != full.signature():
            launched = full.as_launched()
            if space.contains(launched) and is_valid(w, launched):
                return  # the same launch, its inert knobs at their defaults, is in the space: it stands for both
        seen.add(key)
        yield full

    def walk(depth: int) -> Iterator[Strategy]:
        if depth == len(order):
            yield from leaf()
            return
        field, rules = order[depth], schedule[depth]
        for value in (choices(field, data) if choices else tunables[field]):
            data[field] = value
            if rules:
                # A partial assignment: fields not walked yet sit at their defaults, which the rules
                # run here do not read. model_construct skips validation: domains were validated.
                s = Strategy.model_construct(**data)
                dims = ParallelDims.of(s, w.world_size)
                if any(r.check(w, s, dims) for r in rules):
                    continue
            yield from walk(depth + 1)
        data[field] = base[field]

    if not order:
        s = Strategy.model_validate(base)
        if not any(r.check(w, s, ParallelDims.of(s, w.world_size)) for r in RULES):
            yield s
        return
    yield from walk(0)


def in_domain_order(space: SearchSpace, strategies: list[Strategy]) -> list[Strategy]:
    """`strategies` sorted as the product of the domains lists them (the space's own order)."""
    index = {f: {v: i for i, v in enumerate(d)} for f, d in space.tunables.items()}

    def key(s: Strategy) -> tuple:
        return tuple(index[f].get(getattr(s, f), -1) for f in space.tunables)

    return sorted(strategies, key=key)


def _thin(values: list[Any], keep: int) -> list[Any]:
    """`keep` values spread over the ordered non-None values (ends included), plus None if present."""
    numbers = sorted(v for v in values if v is not None)
    if len(numbers) <= keep:
        return values
    step = (len(numbers) - 1) / (keep - 1)
    picked = {numbers[round(i * step)] for i in range(keep)}
    return [v for v in values if v is None or v in picked]


def _lattice(space: SearchSpace, w: Workload) -> Choices:
    """The coarse lattice: uneven first/last stages only as the split Megatron needs when PP does not
    divide the layers (an even split otherwise); AC_LAYERS and offloaded layers at their ends."""
    tunables = space.tunables

    def nearest(field: str, target: int | None) -> list[Any]:
        domain = tunables[field]
        if target in domain:
            return [target]
        goal = target if target is not None else w.model.num_layers // 2
        numbers = [v for v in domain if v is not None]
        return [min(numbers, key=lambda v: abs(v - goal))] if numbers else domain[:1]

    def choices(field: str, data: dict[str, Any]) -> list[Any]:
        if field in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            pp, vpp = data["pipeline_model_parallel_size"], data["virtual_pipeline_model_parallel_size"] or 1
            first, last = ParallelDims(world=w.world_size, tp=1, pp=pp, cp=1, ep=1, etp=1, vpp=vpp) \
                .infer_uneven(w.model.num_layers)
            return nearest(field, first if field.startswith("decoder_first") else last)
        if field in FINE_KNOBS:
            return _thin(tunables[field], 2)
        return tunables[field]

    return choices


class CandidatePool(list):
    """The strategies a job scores: a list (the whole valid space, or its coarse lattice) plus, per
    reference, the valid strategies one change away (`around`)."""

    def __init__(self, strategies: list[Strategy], space: SearchSpace, workload: Workload, complete: bool):
        super().__init__(strategies)
        self.space, self.workload, self.complete = space, workload, complete
        self._launches = {s.launch_key() for s in strategies}
        self._around: dict[str, list[Strategy]] = {}

    def _moves(self, ref: Strategy) -> Iterator[dict[str, Any]]:
        """One changed field at a time, and both uneven stage sizes together (moving layers between
        the end stages changes two knobs at once)."""
        for field, domain in self.space.tunables.items():
            for value in domain:
                if value != getattr(ref, field):
                    yield {field: value}
        first, last = "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"
        if first in self.space.tunables and last in self.space.tunables:
            for a in self.space.tunables[first]:
                for b in self.space.tunables[last]:
                    if a != getattr(ref, first) and b != getattr(ref, last):
                        yield {first: a, last: b}

    def neighbours(self, ref: Strategy) -> list[Strategy]:
        """Valid strategies in the space one move (see `_moves`) from `ref` that launch something else."""
        sig = ref.signature()
        if sig not in self._around:
            out, seen = [], {ref.launch_key()}
            for move in self._moves(ref):
                try:
                    cand = ref.changed(**move)
                except ValueError:
                    continue
                key = cand.launch_key()  # a move of an inert knob launches `ref` again
                if key in seen or not is_valid(self.workload, cand) or not self.space.contains(cand):
                    continue
                seen.add(key)
                out.append(cand)
            self._around[sig] = out
        return self._around[sig]

    def around(self, ref: Strategy) -> list[Strategy]:
        """What to score with `ref` as the reference: the pool, and for a coarse pool the valid
        neighbours of `ref` that are not on it."""
        if self.complete:
            return self
        extra = [s for s in self.neighbours(ref) if s.launch_key() not in self._launches]
        return [*self, *extra]


def candidate_pool(space: SearchSpace, w: Workload, limit: int = POOL_LIMIT) -> CandidatePool:
    """The whole valid space, in the space's domain order, when it has at most `limit` strategies or
    no fine knob to thin; else the coarse lattice (`_lattice`), whose gaps `CandidatePool.around`
    fills near the reference."""
    found: list[Strategy] = []
    coarsens = any(f in space.tunables and len(space.tunables[f]) > 2 for f in FINE_KNOBS)
    for s in valid_strategies(space, w):
        found.append(s)
        if coarsens and len(found) > limit:
            break
    else:
        return CandidatePool(in_domain_order(space, found), space, w, complete=True)
    coarse = list(valid_strategies(space, w, _lattice(space, w)))
    return CandidatePool(in_domain_order(space, coarse), space, w, complete=False)

"""SearchSpace.enumerate: every valid strategy of the space exactly once, in domain order."""

from __future__ import annotations

import itertools

from optico.rules import is_valid
from optico.spec import load_spec
from optico.strategy import Strategy
from tests.conftest import EXAMPLES


def _reference(space, w) -> list[str]:
    """The definition, written plainly: the product in domain order, normalized, valid, first of each."""
    fields, out, seen = list(space.tunables), [], set()
    for values in itertools.product(*(space.tunables[f] for f in fields)):
        s = Strategy.model_validate({**space.fixed, **dict(zip(fields, values))}).normalized()
        if is_valid(w, s) and s.signature() not in seen:
            seen.add(s.signature())
            out.append(s.signature())
    return out


def test_enumerate_matches_the_definition():
    for name in ("llama3-8b-a100.yaml",):
        spec = load_spec(EXAMPLES / name)
        got = [s.signature() for s in spec.search_space.enumerate(spec.workload)]
        assert got == _reference(spec.search_space, spec.workload)
        assert len(got) == len(set(got)) > 100

"""Candidates by constraint: a 50 M-point space is never walked whole, and an iteration's agents
and guard stay under a second on it."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from optico.candidates import candidate_pool, valid_strategies
from optico.knobs import KNOBS
from optico.rules import violations
from optico.search_space import SearchSpace
from optico.strategy import Strategy
from optico.workload import PRESETS, Cluster, Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from iteration_time import large_spec, measure  # noqa: E402


def test_a_large_space_is_scored_on_a_lattice_plus_the_moves_around_the_reference(tmp_path: Path):
    spec = large_spec()
    space, w = spec.search_space, spec.workload
    assert space.size() > 50_000_000
    pool = candidate_pool(space, w)
    assert not pool.complete and 1000 < len(pool) <= 12_000
    assert all(not violations(w, s) and space.contains(s) for s in pool[::97])
    ref = next(s for s in pool if s.pp == 4)
    around = pool.around(ref)
    moved = [s for s in around[len(pool):]]
    # every valid single move is offered, uneven stage sizes included (off the lattice)
    assert any(s.decoder_first_pipeline_num_layers and s.decoder_first_pipeline_num_layers % 2 for s in moved)
    assert all(len(ref.diff(s)) <= 2 for s in moved)


def test_generation_by_constraint_is_lazy():
    spec = large_spec()
    first = []
    for s in valid_strategies(spec.search_space, spec.workload):
        first.append(s)
        if len(first) == 50:
            break
    assert len(first) == 50 and all(not violations(spec.workload, s) for s in first)


def test_agents_and_guard_take_under_a_second_per_iteration(tmp_path: Path):
    out = measure(large_spec(), iterations=5, db_dir=tmp_path)
    # The median, not the max: the first iteration also primes caches; the machine is shared.
    assert statistics.median(out["iteration_s"]) < 1.0, out["iteration_s"]


def test_each_launch_is_in_the_pool_once():
    """p2p overlap and batched p2p change nothing without VPP: the pool holds one strategy per
    distinct launch, and a reference's neighbours never include a move of a knob inert there."""
    w = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=256,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=2))
    space = SearchSpace.build(w, {"pp": [1, 2, 4], "vpp": [1, 2], "mbs": [1, 2],
                                  "overlap_p2p_comm": [False, True], "batch_p2p_comm": [True, False]})
    pool = candidate_pool(space, w)
    keys = [s.launch_key() for s in pool]
    assert len(keys) == len(set(keys))
    assert {s.overlap_p2p_comm for s in pool if s.vpp > 1} == {True, False}
    # the launch stands in the pool with the inert knobs at their defaults, as a user would write it
    assert all(s.overlap_p2p_comm and not s.batch_p2p_comm for s in pool if s.vpp == 1)
    ref = next(s for s in pool if s.pp == 2 and s.vpp == 1)
    assert all(s.launch_key() != ref.launch_key() for s in pool.neighbours(ref))
    assert not any({"overlap_p2p_comm", "batch_p2p_comm"} >= set(ref.diff(s)) for s in pool.neighbours(ref))


def test_an_inert_knob_renders_no_flag_where_it_is_declared_inert():
    """`Knob.inert` is checked against the command: where it holds, both values render the same flags."""
    inert = [k for k in KNOBS if k.inert is not None]
    assert inert
    for base in (Strategy(pipeline_model_parallel_size=2), Strategy(pipeline_model_parallel_size=4),
                 Strategy(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2)):
        for knob in inert:
            values = knob.domain(None) if knob.domain else [knob.default]
            variants = []
            for value in values:
                try:
                    variants.append(base.changed(**{knob.name: value}))
                except ValueError:
                    continue
            if knob.inert(base):
                assert len({tuple(v.megatron_args()) for v in variants}) == 1, knob.name
                assert len({v.launch_key() for v in variants}) == 1, knob.name
            else:
                assert len({v.launch_key() for v in variants}) == len(variants), knob.name

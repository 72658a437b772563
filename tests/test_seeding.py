"""The first configuration of a job without a baseline: the model's pick within memory headroom,
or the best of earlier jobs (warm start)."""

from __future__ import annotations

from optico.agents.seeding import HEADROOM, start_configuration
from optico.perfmodel.online import JobModel
from tests.test_agents import SPACE, W, ok_trial


def _pool_and_model():
    pool = list(SPACE.enumerate(W))
    return pool, JobModel(W)


def test_cold_start_is_the_models_fastest_configuration_within_headroom():
    pool, model = _pool_and_model()
    roomy = [s for s in pool if model.mem_gib(s) <= HEADROOM * model.limit_gib]
    tight = [s for s in pool if HEADROOM * model.limit_gib < model.mem_gib(s) <= model.limit_gib]
    choice, why = start_configuration(pool, model, [])
    assert choice in roomy
    assert model.mfu(choice) == max(model.mfu(s) for s in roomy)
    # The headroom matters here: something predicted faster would fit only without it.
    assert max(model.mfu(s) for s in tight) > model.mfu(choice)
    assert "model's pick" in why


def test_warm_start_reruns_the_best_configuration_earlier_jobs_measured():
    pool, model = _pool_and_model()
    cold, _ = start_configuration(pool, model, [])
    earlier = [ok_trial(1, pool[0], 0.40), ok_trial(2, pool[1], 0.45)]
    choice, why = start_configuration(pool, model, earlier)
    assert choice == pool[1] != cold
    assert why.startswith("warm start")

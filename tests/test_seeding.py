"""The first configuration of a job without a baseline: the model's pick by expected MFU, or the best of
earlier jobs (warm start)."""

from __future__ import annotations

from optico.agents.seeding import start_configuration
from optico.perfmodel.online import JobModel
from tests.test_agents import SPACE, W, ok_trial


def _pool_and_model():
    pool = list(SPACE.enumerate(W))
    return pool, JobModel(W)


def test_cold_start_is_the_models_highest_expected_mfu():
    pool, model = _pool_and_model()
    admitted = [s for s in pool if not model.predicted_oom(s)]
    choice, why = start_configuration(pool, model, [])
    assert choice in admitted
    assert model.expected_mfu(choice) == max(model.expected_mfu(s) for s in admitted)
    # The chance of fitting matters here: something predicted faster is a worse bet on memory.
    faster = [s for s in admitted if model.mfu(s) > model.mfu(choice)]
    assert faster and all(model.fit_probability(s) < model.fit_probability(choice) for s in faster)
    assert "model's pick" in why and "chance of fitting" in why


def test_warm_start_reruns_the_best_configuration_earlier_jobs_measured():
    pool, model = _pool_and_model()
    cold, _ = start_configuration(pool, model, [])
    earlier = [ok_trial(1, pool[0], 0.40), ok_trial(2, pool[1], 0.45)]
    choice, why = start_configuration(pool, model, earlier)
    assert choice == pool[1] != cold
    assert why.startswith("warm start")


def test_nothing_fitting_is_no_launch_and_a_failed_job_naming_the_smallest_memory(tmp_path):
    """A 126-layer, 16K-hidden model on 64 H100s: every layout of the default space needs several times
    a GPU's memory. The job launches nothing (it launched the fastest of them, on 64 GPUs, and then
    said `succeeded`) and fails naming the smallest predicted memory."""
    from optico.pool.store import SqlStore
    from optico.runner import run_job
    from optico.spec import parse_spec_text

    spec = parse_spec_text(
        "name: too-big\n"
        "workload:\n"
        "  model: {name: big, num_layers: 126, hidden_size: 16384, num_attention_heads: 128, num_query_groups: 8,\n"
        "          ffn_hidden_size: 53248, vocab_size: 128256, swiglu: true}\n"
        "  seq_length: 8192\n  global_batch_size: 512\n  precision: bf16\n"
        "  cluster: {gpu: h100-sxm, gpus_per_node: 8, nodes: 8}\n"
        "budget: {max_trials: 5}\n")
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    with SqlStore(url) as store:
        job_id = store.create_job(spec)
        run_job(store, url, job_id)
        job = store.get_job(job_id)
        assert store.trials(job_id) == []
        assert job.status.value == "failed" and job.stop_reason.startswith(
            "no configuration in the search space is expected to fit: the smallest predicted peak memory is")

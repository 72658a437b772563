"""The offline reasoners, the guard and the simulator, on their own."""

from __future__ import annotations

import asyncio

import pytest

from optico.agents import acquisition
from optico.agents.analysis import RulesAnalysis, diagnose_health
from optico.agent_contracts import AnalysisInput, Change, GenerationInput, HealthState, changes_text
from optico.agents.failure import RulesFailureAnalysis
from optico.agent_contracts import FailureInput
from optico.agents.generation import RulesGeneration, repair
from optico.guard import Guard, needs_at_least_as_much_memory
from optico.launchers.sim import SimLauncher
from optico.perfmodel.online import JobModel
from optico.search_space import SearchSpace
from optico.strategy import Strategy, strategy_from_mapping
from optico.trial import Failure, FailureCategory, Metrics, Trial, TrialStatus
from optico.workload import PRESETS, Cluster, Workload

W = Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=512, precision="fp16",
             cluster=Cluster(gpu="a100-80gb"))
SPACE = SearchSpace.build(W, ["tp", "pp", "mbs", "sp", "recompute"], {"use_distributed_optimizer": True})


def S(**kw) -> Strategy:
    return strategy_from_mapping({"distributed_optimizer": True, **kw})


def ok_trial(index: int, s: Strategy, mfu: float, mem: float = 50.0, util: float = 0.9) -> Trial:
    return Trial(id=index, job_id=1, index=index, strategy=s, signature=s.signature(), status=TrialStatus.OK,
                 metrics=Metrics(step_time_s=1.0, tflops_per_gpu=mfu * 312, mfu=mfu, tokens_per_s_per_gpu=1.0,
                                 mem_max_gib=mem, mem_limit_gib=79.2, gpu_util_avg=util))


def failed_trial(index: int, s: Strategy, category: FailureCategory) -> Trial:
    return Trial(id=index, job_id=1, index=index, strategy=s, signature=s.signature(), status=TrialStatus.FAILED,
                 failure=Failure(category=category, summary=f"{category.value}", confidence=90))


OOM_LOG = """[rank0]: Traceback (most recent call last):
[rank0]:   File "pretrain_gpt.py", line 291, in <module>
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB
E1122 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1)"""


@pytest.mark.parametrize("log,hint,attempts,category,retry,params,summary", [
    (OOM_LOG, None, 1, FailureCategory.OOM, False, ["micro_batch_size"], "MICRO_BATCH_SIZE 4 caused CUDA OutOfMemoryError"),
    ("[rank0]: AssertionError: Number of layers should be divisible by the pipeline-model-parallel size", None, 1,
     FailureCategory.INVALID_CONFIG, False, ["pipeline_model_parallel_size"], "PP"),
    ("[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
     "OpType=ALLREDUCE) ran for 600081 milliseconds before timing out.", None, 1, FailureCategory.COMM_TIMEOUT,
     True, [], "No parameter issue. RETRY"),
    ("ray.exceptions.NodeDiedError: node 10.0.0.3 died", None, 1, FailureCategory.INFRASTRUCTURE, True, [],
     "RETRY"),
    ("iteration 2/13\nno output for 600 s: run killed (hang)", FailureCategory.HANG, 2, FailureCategory.HANG, False,
     ["pipeline_model_parallel_size"], "repeated"),
    ("Segmentation fault (core dumped)", None, 1, FailureCategory.UNKNOWN, False, [], "Potential underlying issue"),
])
def test_failure_analysis_forms(log, hint, attempts, category, retry, params, summary):
    s = S(tp=2, pp=2, mbs=4)
    f = RulesFailureAnalysis().diagnose(FailureInput(workload=W, strategy=s, reference=S(tp=2, pp=2, mbs=1),
                                                     log=log, category_hint=hint, attempts=attempts))
    assert f.category == category
    assert f.retry is retry
    assert f.params[: len(params)] == params
    assert summary in f.summary
    assert f"(Confidence: {f.confidence})" in f.summary
    assert len(f.summary.split()) <= 31


def test_an_oom_after_turning_on_megatron_cores_fused_loss_blames_the_fusion():
    """Its native kernel holds a float32 copy of the logits more; Transformer Engine's saves memory."""
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.55 GiB."
    s, ref = S(tp=2, mbs=1, cross_entropy_loss_fusion=True), S(tp=2, mbs=1)
    native = RulesFailureAnalysis().diagnose(FailureInput(workload=W, strategy=s, reference=ref, log=oom))
    assert native.category == FailureCategory.OOM and native.params[0] == "cross_entropy_loss_fusion"
    te = W.model_copy(update={"cross_entropy_fusion_impl": "te"})
    assert "cross_entropy_loss_fusion" not in RulesFailureAnalysis().diagnose(
        FailureInput(workload=te, strategy=s, reference=ref, log=oom)).params


def test_an_invalid_configuration_s_line_is_cut_between_words():
    # "needs Transformer Engine (TEDotProd (Confidence: 90)": the line was cut at 80 characters, mid-word.
    line = ("[rank0]: AssertionError: tp_comm_overlap needs Transformer Engine (TEDotProductAttention, "
            "TELayerNormColumnParallelLinear) which is not installed")
    f = RulesFailureAnalysis().diagnose(FailureInput(workload=W, strategy=S(tp=2, sp=True, tp_comm_overlap=True),
                                                     log=line))
    assert f.category == FailureCategory.INVALID_CONFIG
    assert "TEDotProd " not in f.summary and " ... (Confidence: 90)" in f.summary, f.summary
    # The knob the message names is the one blamed (it began " caused ...", blaming nothing).
    assert f.params == ["tp_comm_overlap"] and f.summary.startswith("TP_COMM_OVERLAP true caused"), f.summary
    f = RulesFailureAnalysis().diagnose(FailureInput(workload=W, strategy=S(tp=2), log="AssertionError: odd"))
    assert f.params == [] and f.summary.startswith("The configuration caused"), f.summary


def test_failure_analysis_reads_first_error_first():
    log = OOM_LOG + "\n[rank1]: Watchdog caught collective operation timeout"
    f = RulesFailureAnalysis().diagnose(FailureInput(workload=W, strategy=S(tp=1, pp=2), log=log))
    assert f.category == FailureCategory.OOM


def test_health_states():
    assert diagnose_health(ok_trial(1, S(tp=2), 0.6, mem=30, util=0.4), None)[0] == HealthState.SEVERELY_UNDERUTILIZED
    assert diagnose_health(ok_trial(1, S(tp=1, pp=4), 0.45, mem=60), None)[0] == HealthState.HIGH_PP_OVERHEAD
    assert diagnose_health(ok_trial(1, S(tp=2), 0.6, mem=77), None)[0] == HealthState.MEMORY_BOUND
    assert diagnose_health(ok_trial(1, S(tp=2), 0.6, mem=50), None)[0] == HealthState.PERFORMANCE_TUNE


def test_implied_oom():
    oom = S(tp=2, pp=1, mbs=2)
    assert needs_at_least_as_much_memory(S(tp=2, pp=1, mbs=4), oom, W)
    assert not needs_at_least_as_much_memory(S(tp=2, pp=1, mbs=4, recompute="full"), oom, W)
    assert not needs_at_least_as_much_memory(S(tp=2, pp=1, mbs=1), oom, W)
    assert not needs_at_least_as_much_memory(S(tp=4, pp=1, mbs=2), oom, W)


def test_the_flags_to_reproduce_a_fused_loss_name_its_kernel_when_not_the_default():
    fused = S(tp=2, cross_entropy_loss_fusion=True)
    te = W.model_copy(update={"cross_entropy_fusion_impl": "te"})
    assert fused.run_args(W) == fused.megatron_args()  # Megatron-LM's default kernel: no flag
    assert fused.run_args(te)[-2:] == ["--cross-entropy-fusion-impl", "te"]
    assert S(tp=2).run_args(te) == S(tp=2).megatron_args()  # no fusion: the kernel never runs


def test_implied_oom_follows_the_cross_entropy_kernel():
    """megatron-core's native fused loss holds one more float32 copy of the logits (the H100 sweep:
    +4 B per element), Transformer Engine's saves memory: which side of a fused OOM is implied flips."""
    fused, unfused = S(tp=2, mbs=2, cross_entropy_loss_fusion=True), S(tp=2, mbs=2)
    te = W.model_copy(update={"cross_entropy_fusion_impl": "te"})
    assert W.cross_entropy_fusion_impl == "native"  # megatron-core's default
    assert needs_at_least_as_much_memory(fused, unfused, W) and not needs_at_least_as_much_memory(unfused, fused, W)
    assert needs_at_least_as_much_memory(unfused, fused, te) and not needs_at_least_as_much_memory(fused, unfused, te)


def test_guard_rules():
    model = JobModel(W)
    guard = Guard(W, SPACE, model)
    history = [ok_trial(1, S(tp=2), 0.67), failed_trial(2, S(tp=2, mbs=2), FailureCategory.OOM)]
    assert guard.check(S(tp=3), history).rule == "invalid"
    assert guard.check(S(tp=2), history).rule == "duplicate"
    assert guard.check(S(tp=2, mbs=4), history).rule == "implied-oom"
    assert guard.check(S(tp=1, pp=1), history).rule == "predicted-oom"
    assert guard.check(S(tp=2, cross_entropy_loss_fusion=True), history).rule == "outside-space"
    assert guard.check(S(tp=4), history).admitted
    # A known failure of an earlier job on the same workload counts too.
    prior = [failed_trial(9, S(tp=4), FailureCategory.INVALID_CONFIG)]
    assert guard.check(S(tp=4), history, prior).rule == "known-failure"


def test_a_knob_that_changes_nothing_here_is_no_new_launch():
    """Without VPP, Megatron-LM turns p2p overlap off and derives batched p2p itself: a strategy that
    differs from a tried one only there launches the same command, and is refused as a duplicate."""
    space = SearchSpace.build(W, ["pp", "vpp", "overlap_p2p_comm", "batch_p2p_comm"],
                              {"use_distributed_optimizer": True})
    guard = Guard(W, space, JobModel(W))
    history = [ok_trial(1, S(tp=1, pp=2), 0.5)]
    same_command = S(tp=1, pp=2, overlap_p2p_comm=False, batch_p2p_comm=True)
    assert same_command.signature() != history[0].signature  # the stored identity is untouched
    verdict = guard.check(same_command, history)
    assert verdict.rule == "duplicate"
    assert "same as trial 1" in verdict.reason and "batch_p2p_comm, overlap_p2p_comm" in verdict.reason
    # With VPP the flag is rendered and changes the schedule: another launch.
    history.append(ok_trial(2, S(tp=1, pp=4, vpp=2), 0.5))
    assert guard.check(S(tp=1, pp=4, vpp=2, overlap_p2p_comm=False), history).admitted


def test_guard_verdicts_follow_the_models_fit():
    """Verdicts are reused for the same trials (equal records read again included), but not across a
    re-fit of the job model: a memory measurement that lifts the posterior must reach the guard."""
    model = JobModel(W)
    guard = Guard(W, SPACE, model)
    ref, near = S(tp=2), S(tp=2, mbs=2, sp=True)
    history = [ok_trial(1, ref, 0.6, mem=model.base(ref).mem_gib)]
    model.observe(history)
    assert guard.check(near, history).admitted
    assert guard.check(near, [ok_trial(1, ref, 0.6, mem=model.base(ref).mem_gib)]).admitted  # the same, read again
    model.observe([ok_trial(1, ref, 0.6, mem=model.base(ref).mem_gib * 1.4)])  # it used 40 % more than modelled
    assert guard.check(near, history).rule == "predicted-oom"


def test_job_model_answers_a_pool_with_repeated_configurations_by_signature():
    """The job model answers its whole pool in one array pass; a configuration listed twice must not
    shift every later configuration's answer onto its neighbour's row."""
    pool = list(SPACE.enumerate(W))[:50]
    plain, repeated = JobModel(W), JobModel(W)
    plain.prime(pool)
    repeated.prime([pool[0], pool[0], *pool[1:]])
    history = [ok_trial(1, pool[3], 0.5, mem=40)]
    for model in (plain, repeated):
        model.observe(history)
    assert [repeated.belief(s) for s in pool] == [plain.belief(s) for s in pool]
    assert [repeated.mem_gib(s) for s in pool] == [plain.mem_gib(s) for s in pool]


def test_guard_respects_launcher_candidates():
    guard = Guard(W, SPACE, JobModel(W), candidates=[S(tp=2), S(tp=4)])
    assert guard.check(S(tp=8), []).rule == "not-measurable"
    assert guard.check(S(tp=4), []).admitted


def test_analysis_ranks_untried_admissible_suggestions():
    model = JobModel(W)
    guard = Guard(W, SPACE, model)
    pool = list(SPACE.enumerate(W))
    history = [ok_trial(1, S(tp=2), 0.67, mem=56)]
    out = RulesAnalysis(model, guard, pool).analyze(AnalysisInput(
        workload=W, search_space=SPACE, history=history, reference=S(tp=2), iteration=2))
    assert out.health == HealthState.PERFORMANCE_TUNE
    assert out.suggestions
    texts = [s.text for s in out.suggestions]
    assert all(t.startswith("Change ") and t.endswith(".") for t in texts)
    assert S(tp=2).signature() not in {S(tp=2).changed(**{c.param: c.new for c in s.changes}).signature()
                                       for s in out.suggestions}
    # The best first: expected MFU gain over the best run under the job model's uncertainty
    # (optico.agents.acquisition); near-ties (TIE) go to smaller moves.
    best = model.incumbent_mfu()

    def score(suggestion) -> float:
        return acquisition.expected_gain(model, S(tp=2).changed(**{c.param: c.new for c in suggestion.changes}), best)

    scores = [score(s) for s in out.suggestions]
    assert scores[0] >= max(scores) - acquisition.TIE
    assert "Step 1, health" in out.reasoning

    gen = RulesGeneration().generate(GenerationInput(workload=W, search_space=SPACE, reference=S(tp=2),
                                                     analysis=out))
    assert gen.proposals and all(SPACE.contains(p.strategy) for p in gen.proposals)


def test_changes_text_in_paper_form():
    assert changes_text([Change(param="tensor_model_parallel_size", old=2, new=1)]) == "Change TP from 2 to 1."
    assert changes_text([Change(param="tensor_model_parallel_size", old=2, new=1),
                         Change(param="pipeline_model_parallel_size", old=1, new=2)]) == \
        "Change TP from 2 to 1 and PP from 1 to 2."


def test_repair_switches_off_coupled_flags():
    s = repair(S(tp=2, sp=True).changed(tensor_model_parallel_size=1), SPACE)
    assert not s.sequence_parallel


def test_sim_launcher_realistic_and_repeatable():
    sim = SimLauncher(seed=3, hang_rate=0.0)
    good = asyncio.run(sim.launch(W, S(tp=2), trial_key="k1"))
    again = asyncio.run(sim.launch(W, S(tp=2), trial_key="k1"))
    assert good.ok and good.metrics.mfu == again.metrics.mfu
    assert 0.4 < good.metrics.mfu < 0.9 and good.metrics.mem_max_gib < 79.2
    oom = asyncio.run(sim.launch(W, S(tp=1, pp=1, mbs=4), trial_key="k2"))
    assert not oom.ok and "torch.OutOfMemoryError: CUDA out of memory" in oom.log
    bad = asyncio.run(sim.launch(W, Strategy(tensor_model_parallel_size=3), trial_key="k3"))
    assert not bad.ok and "AssertionError: num_attention_heads (32) must be divisible by TP (3)" in bad.log
    hangs = [asyncio.run(SimLauncher(seed=i, hang_rate=1.0).launch(W, S(tp=2), trial_key="h")) for i in range(6)]
    assert all(not r.ok for r in hangs)
    assert any(r.category_hint == FailureCategory.HANG for r in hangs)
    assert any("Watchdog caught collective operation timeout" in r.log for r in hangs)


def test_guard_blocks_a_refused_setting_not_just_its_configuration():
    guard = Guard(W, SearchSpace.build(W, ["tp", "pp", "mbs", "cp"], {"use_distributed_optimizer": True}),
                  JobModel(W))
    refused = Trial(id=1, job_id=1, index=1, strategy=S(tp=2, cp=2), signature=S(tp=2, cp=2).signature(),
                    status=TrialStatus.FAILED,
                    failure=Failure(category=FailureCategory.INVALID_CONFIG, confidence=90,
                                    params=["context_parallel_size"], summary="CP 2 caused invalid configuration"))
    assert guard.check(S(tp=4, cp=2), [refused]).rule == "known-failure"
    assert guard.check(S(tp=4, cp=1), [refused]).admitted
    unsure = refused.model_copy(update={"failure": refused.failure.model_copy(update={"confidence": 40})})
    assert guard.check(S(tp=4, cp=2), [unsure]).admitted


def test_guard_lets_a_layout_live_when_a_bigger_sibling_fitted():
    model = JobModel(W)
    guard = Guard(W, SPACE, model)
    oom = failed_trial(2, S(tp=2, mbs=1, sp=True), FailureCategory.OOM)
    # the model's saving of selective recompute over the OOM is small: blocked on its own...
    candidate = S(tp=2, mbs=1, sp=True, recompute="selective")
    assert model.base(oom.strategy).mem_gib - model.base(candidate).mem_gib < 0.03 * model.limit_gib
    assert guard.check(candidate, [oom]).rule == "implied-oom"
    # ...but not once a same-layout run needing at least as much memory has fitted
    sibling = ok_trial(1, S(tp=2, mbs=1), 0.6)
    assert model.base(sibling.strategy).mem_gib >= model.base(candidate).mem_gib
    assert guard.check(candidate, [sibling, oom]).admitted


def test_guard_check_all_gives_each_candidates_own_verdict():
    """The pass over the pool (the analysis and the stopping rule) answers as `check` does one by one,
    rule and reason, with every kind of failure on record: a duplicate, an OOM (implied and small-saving
    siblings), a refused setting, a hang (transient: says nothing about the configuration)."""
    space = SearchSpace.build(W, ["tp", "pp", "mbs", "sp", "recompute", "cp"], {"use_distributed_optimizer": True})
    pool = list(space.enumerate(W))
    refused = Trial(id=4, job_id=1, index=4, strategy=S(tp=4, cp=2), signature=S(tp=4, cp=2).signature(),
                    status=TrialStatus.FAILED,
                    failure=Failure(category=FailureCategory.INVALID_CONFIG, confidence=90,
                                    params=["context_parallel_size"], summary="CP 2 caused invalid configuration"))
    history = [ok_trial(1, S(tp=2), 0.6, mem=60), failed_trial(2, S(tp=2, mbs=2), FailureCategory.OOM),
               failed_trial(3, S(tp=8), FailureCategory.HANG), refused]
    model = JobModel(W)
    model.prime(pool)
    model.observe(history)
    one_by_one = [Guard(W, space, model).check(s, history) for s in pool]
    together = Guard(W, space, model).check_all(pool, history)
    assert together == one_by_one
    rules = {v.rule for v in together}
    assert {"duplicate", "implied-oom", "known-failure", "predicted-oom", ""} <= rules


def test_a_diagnosis_is_shown_with_its_confidence_once():
    """The paper's forms end with "(Confidence: N)"; a summary without it (a run lost to a dead worker)
    gets it appended, one that has it is shown as it is."""
    from optico.trial import Failure, FailureCategory

    paper = Failure(category=FailureCategory.OOM, summary="micro_batch_size 8 caused OOM (Confidence: 92)",
                    confidence=92)
    lost = Failure(category=FailureCategory.INFRASTRUCTURE, summary="lost: the worker running it stopped",
                   confidence=100)
    assert paper.described() == paper.summary
    assert lost.described() == "lost: the worker running it stopped (Confidence: 100)"


def test_a_converged_stop_states_a_gain_visibly_below_its_threshold():
    from optico.agents.stopping import converged_text

    text = converged_text(10, 0.000996, 0.495, 0.001)
    assert "gain 0.0996% over the best (49.5% MFU, smoothed) — below 0.1%" in text  # it read "0.10% ... below 0.1%"
    assert "gain 0.31% over" in converged_text(4, 0.0031, 0.6, 0.005) and "below 0.5%" in converged_text(4, 0.0031, 0.6, 0.005)

"""Bottleneck analysis, offline: the paper's chain of thought as code.

1. Health diagnosis of the reference run (best so far): the paper's four states.
2. Bottleneck class with evidence: measured metrics plus the performance model.
3. Ranked "Change X from A to B." suggestions over the untried, not-known-to-fail,
   predicted-to-fit configurations, scored by the job-corrected performance model;
   ranked by expected MFU (predicted MFU times the chance of fitting in memory);
   moves that answer the health state and the bottleneck with one or two changes
   come first (standard tuning), larger jumps follow (exploratory fallback).
"""

from __future__ import annotations

from optico.agents.contracts import (
    AnalysisInput,
    AnalysisOutput,
    Change,
    HealthState,
    Suggestion,
)
from optico.guard import Guard
from optico.knobs import BY_NAME
from optico.parallel import ParallelDims
from optico.perfmodel.bottleneck import Bottleneck
from optico.perfmodel.online import JobModel
from optico.strategy import Strategy
from optico.trial import Trial, TrialStatus

# Suggestions within this MFU of each other count as a tie: the smaller move wins.
_TIE = 0.004
# A parallel layout the job has not measured yet gets this much optimism: the model's error there is
# uncorrected, and a tuner that only trusts the model never learns where the model is wrong.
EXPLORE_BONUS = 0.02
# A move answering the health state goes first if it is expected within this fraction of the best.
_HEALTH_SLACK = 0.03


def _layout(s: Strategy) -> tuple:
    return ParallelDims.of(s, 0).key


def diagnose_health(ref: Trial | None, mem_fraction: float | None) -> tuple[HealthState, str]:
    """The paper's rules, in its order."""
    if ref is None or ref.metrics is None:
        return HealthState.PERFORMANCE_TUNE, "no successful run yet: tune from the model's view"
    m, s = ref.metrics, ref.strategy
    mem = m.mem_fraction if m.mem_fraction is not None else mem_fraction
    util = m.gpu_util_avg
    if util is not None and mem is not None and util < 0.5 and mem < 0.7:
        return HealthState.SEVERELY_UNDERUTILIZED, f"GPU util {util:.0%} < 50% and memory {mem:.0%} < 70%"
    if s.pp > 1 and m.mfu < 0.5:
        return HealthState.HIGH_PP_OVERHEAD, f"PP {s.pp} > 1 and MFU {m.mfu:.1%} < 50%"
    if mem is not None and mem > 0.95:
        return HealthState.MEMORY_BOUND, f"memory {mem:.0%} > 95% of the limit"
    return HealthState.PERFORMANCE_TUNE, f"healthy (MFU {m.mfu:.1%}" + (f", memory {mem:.0%})" if mem else ")")


def _answers(health: HealthState, bottleneck: Bottleneck, ref: Strategy, cand: Strategy,
             model: JobModel) -> bool:
    """Whether a move addresses the diagnosed state (standard tuning) rather than exploring."""
    if health == HealthState.SEVERELY_UNDERUTILIZED:
        return cand.model_parallel_size < ref.model_parallel_size or cand.mbs > ref.mbs
    if health == HealthState.HIGH_PP_OVERHEAD:
        return cand.pp < ref.pp or cand.vpp > ref.vpp
    if health == HealthState.MEMORY_BOUND or bottleneck == Bottleneck.MEMORY_CAPACITY:
        return model.mem_gib(cand) < model.mem_gib(ref)
    if bottleneck == Bottleneck.PIPELINE_BUBBLE:
        return cand.pp < ref.pp or cand.vpp > ref.vpp or cand.mbs != ref.mbs
    if bottleneck == Bottleneck.COMMUNICATION:
        return (cand.tp < ref.tp or cand.cp < ref.cp or cand.ep != ref.ep
                or any(getattr(cand, f) and not getattr(ref, f) for f in
                       ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap")))
    return True


def _reason(ref_pred, cand_pred, changes: list[Change]) -> str:
    """Why this move, in terms of the reference's time breakdown."""
    t, step = ref_pred.time, ref_pred.time.step_time_s
    params = {c.param for c in changes}
    bits = []
    if "tensor_model_parallel_size" in params:
        bits.append(f"TP collectives take {t.tp_comm_s / step:.0%} of the step")
    if "pipeline_model_parallel_size" in params or "virtual_pipeline_model_parallel_size" in params:
        bits.append(f"pipeline bubble and imbalance take {t.pp_bubble_s / step:.0%}")
    if "recompute_granularity" in params:
        bits.append(f"recompute takes {t.recompute_s / step:.0%}")
    if params & {"overlap_grad_reduce", "overlap_param_gather", "use_distributed_optimizer"}:
        bits.append(f"exposed DP sync takes {t.dp_comm_s / step:.0%}")
    if "micro_batch_size" in params:
        bits.append("the micro-batch sets GEMM sizes and the number of pipeline steps")
    if "context_parallel_size" in params:
        bits.append(f"CP exchange takes {t.cp_comm_s / step:.0%}")
    if "expert_model_parallel_size" in params or "moe_token_dispatcher_type" in params:
        bits.append(f"EP all-to-all takes {t.ep_comm_s / step:.0%}")
    for name in sorted(params):  # any other knob: the time terms the registry says it moves
        for term in (BY_NAME[name].terms if name in BY_NAME else ()):
            label = _TERMS.get(term)
            if label and not any(b.startswith(label) for b in bits):
                bits.append(f"{label} takes {getattr(t, term) / step:.0%}")
    if not bits:
        bits.append(f"bottleneck {ref_pred.bottleneck.value}")
    return "; ".join(bits)


_TERMS = {"compute_s": "compute", "recompute_s": "recompute", "tp_comm_s": "TP collectives",
          "cp_comm_s": "CP exchange", "ep_comm_s": "EP all-to-all", "p2p_s": "pipeline p2p",
          "pp_bubble_s": "pipeline bubble and imbalance", "dp_comm_s": "exposed DP sync",
          "offload_s": "activation offload copies"}


class RulesAnalysis:
    """The offline bottleneck-analysis reasoner."""

    name = "rules"

    def __init__(self, model: JobModel, guard: Guard, pool: list[Strategy]):
        """`pool`: every valid strategy the job may run (the search space, or a launcher's finite set)."""
        self.model, self.guard, self.pool = model, guard, pool

    def analyze(self, inp: AnalysisInput) -> AnalysisOutput:
        model, ref = self.model, inp.reference
        model.observe([*inp.prior, *inp.history])
        ref_trial = next((t for t in reversed(inp.history) if t.signature == ref.signature()
                          and t.status == TrialStatus.OK), None)
        ref_pred = model.base(ref)
        health, why = diagnose_health(ref_trial, model.mem_gib(ref) / model.limit_gib)
        bottleneck, evidence = ref_pred.bottleneck, list(ref_pred.evidence)
        if ref_trial and ref_trial.metrics:
            m = ref_trial.metrics
            measured = f"measured MFU {m.mfu:.1%}, {m.tflops_per_gpu:.0f} TFLOP/s/GPU"
            if m.mem_max_gib:
                measured += f", memory {m.mem_max_gib:.1f}/{m.mem_limit_gib or model.limit_gib:.1f} GiB"
            if m.gpu_util_avg is not None:
                measured += f", GPU util {m.gpu_util_avg:.0%}"
            evidence.insert(0, measured)
        if health == HealthState.MEMORY_BOUND:
            bottleneck = Bottleneck.MEMORY_CAPACITY

        ref_mfu = ref_trial.metrics.mfu if ref_trial and ref_trial.metrics else model.mfu(ref)
        measured_layouts = {_layout(t.strategy) for t in inp.history if t.status == TrialStatus.OK}
        counts = {"tried or known to fail": 0, "predicted OOM": 0, "other": 0}
        scored: list[tuple[float, int, bool, Strategy]] = []
        # A coarse pool (a very large space) adds the moves around the reference; a list is scored whole.
        for cand in self.pool.around(ref) if hasattr(self.pool, "around") else self.pool:
            verdict = self.guard.check(cand, inp.history, inp.prior)
            if not verdict.admitted:
                key = {"duplicate": "tried or known to fail", "known-failure": "tried or known to fail",
                       "implied-oom": "tried or known to fail", "predicted-oom": "predicted OOM"}.get(verdict.rule, "other")
                counts[key] += 1
                continue
            n_changes = len(ref.diff(cand))
            standard = n_changes <= 2 and _answers(health, bottleneck, ref, cand, model)
            score = model.expected_mfu(cand)
            if _layout(cand) not in measured_layouts:
                score *= 1 + EXPLORE_BONUS  # optimism where no measurement has corrected the model yet
            scored.append((score, n_changes, standard, cand))

        # Best predicted first; near-ties go to standard moves, then to fewer changes.
        scored.sort(key=lambda x: (-round(x[0] / _TIE), not x[2], x[1]))
        if health != HealthState.PERFORMANCE_TUNE and scored:
            # The diagnosed state is answered first, as the paper's procedure does — unless the
            # model expects clearly more from another move (a rule must not hide a large win).
            best = scored[0][0]
            scored.sort(key=lambda x: not (x[2] and x[0] >= best * (1 - _HEALTH_SLACK)))
        suggestions = []
        for _, n_changes, standard, cand in scored[: inp.max_suggestions]:
            mfu = model.mfu(cand)
            changes = [Change(param=f, old=old, new=new) for f, (old, new) in ref.diff(cand).items()]
            cand_pred = model.base(cand)
            suggestions.append(Suggestion(
                changes=changes,
                reason=_reason(ref_pred, cand_pred, changes),
                expected_effect=(f"MFU {ref_mfu:.1%} -> {mfu:.1%} (model), memory "
                                 f"{model.mem_gib(cand):.1f}/{model.limit_gib:.1f} GiB"),
                predicted_mfu=mfu, predicted_mem_gib=model.mem_gib(cand),
                kind="standard" if standard else "exploratory"))
        reasoning = "\n".join([
            f"Step 1, health: {health.value} — {why}.",
            f"Step 2, bottleneck: {bottleneck.value} — {'; '.join(evidence[:4])}.",
            f"Step 3, candidates: {len(scored)} admissible; excluded {counts['tried or known to fail']} tried or "
            f"known to fail, {counts['predicted OOM']} predicted OOM, {counts['other']} other.",
            "Top: " + (" | ".join(f"{s.text} ({s.kind}, {s.expected_effect})" for s in suggestions[:3]) or "none"),
        ])
        return AnalysisOutput(health=health, health_reason=why, bottleneck=bottleneck, evidence=evidence,
                              suggestions=suggestions, reasoning=reasoning, reasoner=self.name)


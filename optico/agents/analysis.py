"""Bottleneck analysis, offline: the paper's chain of thought as code.

1. Health diagnosis of the reference run (best so far): the paper's four states.
2. Bottleneck class with evidence: measured metrics plus the performance model.
3. Ranked "Change X from A to B." suggestions over the untried, not-known-to-fail,
   predicted-to-fit configurations, ranked by `optico.agents.acquisition`: the expected
   MFU gain over the best run under the job model's remaining uncertainty, times the
   chance of fitting in memory; near-ties and a diagnosed health state go to moves that
   answer the state and the bottleneck with one or two changes (standard tuning).
"""

from __future__ import annotations

from optico.agents import acquisition
from optico.agent_contracts import (
    AnalysisInput,
    AnalysisOutput,
    Change,
    HealthState,
    Suggestion,
)
from optico.guard import Guard
from optico.knobs import BY_NAME
from optico.perfmodel.bottleneck import Bottleneck
from optico.perfmodel.online import JobModel
from optico.strategy import Strategy
from optico.trial import Trial, TrialStatus

def _pct(x: float, bound: float) -> str:
    """`x` as a percentage precise enough not to read as `bound` ("95.0% > 95%" is no reason)."""
    for digits in range(4):
        text = f"{x:.{digits}%}"
        if abs(float(text[:-1]) / 100 - bound) > 1e-12:
            return text
    return f"{x:.4%}"


def diagnose_health(ref: Trial | None, mem_fraction: float | None) -> tuple[HealthState, str]:
    """The paper's rules, in its order."""
    if ref is None or ref.metrics is None:
        return HealthState.PERFORMANCE_TUNE, "no successful run yet: tune from the model's view"
    m, s = ref.metrics, ref.strategy
    mem = m.mem_fraction if m.mem_fraction is not None else mem_fraction
    util = m.gpu_util_avg
    if util is not None and mem is not None and util < 0.5 and mem < 0.7:
        return HealthState.SEVERELY_UNDERUTILIZED, f"GPU util {_pct(util, 0.5)} < 50% and memory {_pct(mem, 0.7)} < 70%"
    if s.pp > 1 and m.mfu < 0.5:
        return HealthState.HIGH_PP_OVERHEAD, f"PP {s.pp} > 1 and MFU {m.mfu:.1%} < 50%"
    if mem is not None and mem > 0.95:
        return HealthState.MEMORY_BOUND, f"memory {_pct(mem, 0.95)} > 95% of the limit"
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
    """Why this move, as the model sees it: the shares of the step the changed knobs act on, before
    and after (a share under half a percent on both sides is no reason and is left out)."""
    params = {c.param for c in changes}
    bits = []

    def share(label: str, attr: str) -> None:
        before = getattr(ref_pred.time, attr) / ref_pred.time.step_time_s
        after = getattr(cand_pred.time, attr) / cand_pred.time.step_time_s
        if max(before, after) >= 0.005:
            bits.append(f"{label} {before:.0%} -> {after:.0%} of the step")

    if "tensor_model_parallel_size" in params:
        share("TP collectives", "tp_comm_s")
    if "pipeline_model_parallel_size" in params or "virtual_pipeline_model_parallel_size" in params:
        share("pipeline bubble and imbalance", "pp_bubble_s")
    if "recompute_granularity" in params:
        share("recompute", "recompute_s")
        bits.append(f"memory {ref_pred.mem_gib:.1f} -> {cand_pred.mem_gib:.1f} GiB")
    if params & {"overlap_grad_reduce", "overlap_param_gather", "use_distributed_optimizer"}:
        share("exposed DP sync", "dp_comm_s")
    if "micro_batch_size" in params:
        bits.append("the micro-batch sets GEMM sizes and the number of pipeline steps")
    if "context_parallel_size" in params:
        share("CP exchange", "cp_comm_s")
    if "expert_model_parallel_size" in params or "moe_token_dispatcher_type" in params:
        share("EP all-to-all", "ep_comm_s")
    for name in sorted(params):  # any other knob: the time terms the registry says it moves
        for term in (BY_NAME[name].terms if name in BY_NAME else ()):
            label = _TERMS.get(term)
            if label and not any(b.startswith(label) for b in bits):
                share(label, term)
    if not bits:
        bits.append(f"bottleneck {ref_pred.bottleneck.value}; predicted step {ref_pred.time.step_time_s:.3g} s -> "
                    f"{cand_pred.time.step_time_s:.3g} s")
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
        counts = {"tried or known to fail": 0, "predicted OOM": 0, "other": 0}
        entries: list[tuple[Strategy, int, bool]] = []
        # A coarse pool (a very large space) adds the moves around the reference; a list is scored whole.
        pool = self.pool.around(ref) if hasattr(self.pool, "around") else self.pool
        for cand, verdict in zip(pool, self.guard.check_all(pool, inp.history, inp.prior)):
            if not verdict.admitted:
                key = {"duplicate": "tried or known to fail", "known-failure": "tried or known to fail",
                       "implied-oom": "tried or known to fail", "predicted-oom": "predicted OOM"}.get(verdict.rule, "other")
                counts[key] += 1
                continue
            n_changes = ref.count_changes(cand)
            entries.append((cand, n_changes, n_changes <= 2 and _answers(health, bottleneck, ref, cand, model)))
        # Expected gain under the residual model's uncertainty (optico.agents.acquisition).
        scored = acquisition.rank(model, entries, answer_health=health != HealthState.PERFORMANCE_TUNE)
        suggestions = []
        for _, n_changes, standard, cand in scored[: inp.max_suggestions]:
            mfu = model.mfu(cand)
            changes = [Change(param=f, old=old, new=new) for f, (old, new) in ref.diff(cand).items()]
            cand_pred = model.base(cand)
            suggestions.append(Suggestion(
                changes=changes,
                reason=_reason(ref_pred, cand_pred, changes),
                expected_effect=(f"MFU {ref_mfu:.1%} -> {mfu:.1%} (model"
                                 + (", a predicted loss" if mfu < ref_mfu - 0.0005 else "")
                                 + f"), memory {model.mem_gib(cand):.1f}/{model.limit_gib:.1f} GiB"),
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


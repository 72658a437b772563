"""The deterministic guard: no candidate reaches hardware unless code admits it.

Checks, in order: Megatron's validity rules, the search space, the launcher's
finite set (a replay table), duplicates of this job's trials, known failures of
this or earlier jobs on the workload, OOMs implied by a known OOM (same parallel
layout with a larger micro-batch or less recompute), and a performance-model OOM
prediction beyond the margin. The LLM proposes; it never has the last word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from optico.fingerprint import describe, framework_of, split_by_framework
from optico.knobs import KNOBS
from optico.parallel import ParallelDims
from optico.perfmodel.online import JobModel
from optico.rules import violations
from optico.search_space import SearchSpace
from optico.strategy import Strategy
from optico.trial import FailureCategory, Trial, TrialStatus
from optico.workload import Workload


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    rule: str = ""
    reason: str = ""


ADMIT = Verdict(True)

# Failures that say nothing about the configuration itself.
_TRANSIENT = {FailureCategory.INFRASTRUCTURE, FailureCategory.HANG, FailureCategory.COMM_TIMEOUT}


# A configuration sharing a known OOM's layout must save at least this share of GPU memory (by the
# model) to be worth a launch: the OOM says memory was already over the limit by an unknown amount.
SMALL_SAVING = 0.03
# Knobs with a memory order (registry): a larger key saves memory.
_MEMORY_ORDERS = [k.memory_order for k in KNOBS if k.memory_order is not None]


# Parallel layout by strategy signature: the guard compares layouts for every candidate against every
# known OOM, and hashing a strategy (a pydantic model) per lookup cost more than the comparison.
_LAYOUT_KEYS: dict[str, tuple] = {}
_LAYOUT_KEYS_MAX = 65536


def _layout_key(s: Strategy) -> tuple:
    sig = s.signature()
    key = _LAYOUT_KEYS.get(sig)
    if key is None:
        if len(_LAYOUT_KEYS) >= _LAYOUT_KEYS_MAX:
            _LAYOUT_KEYS.clear()
        key = _LAYOUT_KEYS[sig] = ParallelDims.of(s, 0).key
    return key


def _same_layout(a: Strategy, b: Strategy) -> bool:
    return _layout_key(a) == _layout_key(b)


def needs_at_least_as_much_memory(candidate: Strategy, oom: Strategy, w: Workload) -> bool:
    """True when `candidate` keeps `oom`'s parallel layout and saves no memory anywhere on `w` (by
    every knob's memory order in the registry: micro-batch, recompute, SP, distributed optimizer, ...)."""
    if not _same_layout(candidate, oom):
        return False
    return all(order(candidate, w) <= order(oom, w) for order in _MEMORY_ORDERS)


def _refuses_a_setting(failed: Trial) -> bool:
    """The framework refused a setting (not a size), by a confident invalid-configuration diagnosis
    that blames parameters; an OOM or a timeout says nothing about other configurations this way."""
    f = failed.failure
    return f is not None and f.category == FailureCategory.INVALID_CONFIG and f.confidence >= 80 and bool(f.params)


def _shares_blamed_values(s: Strategy, failed: Trial) -> bool:
    """Every parameter `failed`'s diagnosis blames has the same value in `s` — e.g. CP 2 without
    Transformer Engine, when `failed` refused a setting (`_refuses_a_setting`)."""
    return all(getattr(s, p, None) == getattr(failed.strategy, p, None) for p in failed.failure.params)


def _setting_text(failed: Trial) -> str:
    return ", ".join(f"{p}={getattr(failed.strategy, p)}" for p in failed.failure.params)


def _duplicate_text(s: Strategy, earlier: Trial) -> str:
    """Why `s` repeats `earlier`: the same configuration, or one whose differences change nothing."""
    inert = sorted(s.diff(earlier.strategy))
    if not inert:
        return f"same configuration as trial {earlier.index}"
    verb = "changes" if len(inert) == 1 else "change"
    return f"launches the same as trial {earlier.index}: {', '.join(inert)} {verb} nothing in this configuration"


@dataclass(frozen=True)
class _Failed:
    """A failed trial with what every candidate is compared against, worked out once per view."""

    trial: Trial
    launch: str  # its `Strategy.launch_key`: a candidate launching the same is the same configuration
    lasting: bool  # a failure of the configuration itself (not infrastructure, a hang, a timeout)
    refused: bool  # `_refuses_a_setting`: a candidate sharing its blamed values is refused too
    oom_layout: tuple | None  # the parallel layout, when it ran out of memory

    @classmethod
    def of(cls, t: Trial) -> "_Failed":
        category = t.failure.category
        return cls(t, t.strategy.launch_key(), category not in _TRANSIENT, _refuses_a_setting(t),
                   _layout_key(t.strategy) if category == FailureCategory.OOM else None)


@dataclass(frozen=True)
class _HistoryView:
    """What `check` reads of the trials, derived once per (history, prior) and not per candidate:
    an iteration checks thousands of candidates against the same trials."""

    history: tuple[Trial, ...]
    prior: tuple[Trial, ...]
    first_launch: dict[str, Trial]  # launch key -> the first trial of this job that launched it
    trials: list[Trial]  # this job's trials, then earlier jobs' under this framework
    failed: list[_Failed]  # those of `trials` that failed with a diagnosis, in order
    stale: list[Trial]  # earlier jobs' trials under another framework: hints only
    verdicts: dict[tuple[int, str], Verdict] = field(default_factory=dict)  # (model fit, signature) -> verdict

    @classmethod
    def of(cls, history: Sequence[Trial], prior: Sequence[Trial]) -> "_HistoryView":
        same, stale = split_by_framework(history, prior)
        trials = [*history, *same]
        first_launch: dict[str, Trial] = {}
        for t in history:
            first_launch.setdefault(t.strategy.launch_key(), t)
        failed = [_Failed.of(t) for t in trials if t.status == TrialStatus.FAILED and t.failure is not None]
        return cls(tuple(history), tuple(prior), first_launch, trials, failed, stale)

    def matches(self, history: Sequence[Trial], prior: Sequence[Trial]) -> bool:
        """The same trials: the same frozen records, or equal ones read again from the pool (each
        node of the loop reads the trials afresh; the analysis and the stopping rule see the same)."""
        return (len(history) == len(self.history) and len(prior) == len(self.prior)
                and all(a is b or a == b for a, b in zip(history, self.history))
                and all(a is b or a == b for a, b in zip(prior, self.prior)))


class Guard:
    """Admits or rejects candidates for one job."""

    def __init__(self, workload: Workload, space: SearchSpace, model: JobModel,
                 candidates: list[Strategy] | None = None):
        self.workload, self.space, self.model = workload, space, model
        self._measurable = {s.signature() for s in candidates} if candidates is not None else None
        self._static: dict[str, Verdict] = {}
        # The last (history list, prior list, their view): a pass over the pool checks thousands of
        # candidates against the same two lists (never edited in place), compared once, not per candidate.
        self._view: tuple[Sequence[Trial], Sequence[Trial], _HistoryView] | None = None

    def _history_view(self, history: Sequence[Trial], prior: Sequence[Trial]) -> _HistoryView:
        last = self._view  # one read: a guard shared across threads still answers from its own view
        if last is not None and last[0] is history and last[1] is prior \
                and len(history) == len(last[2].history) and len(prior) == len(last[2].prior):
            return last[2]
        view = last[2] if last is not None and last[2].matches(history, prior) else _HistoryView.of(history, prior)
        self._view = (history, prior, view)
        return view

    def _static_check(self, s: Strategy) -> Verdict:
        """The checks that depend on the configuration alone (cached: they never change in a job)."""
        sig = s.signature()
        if sig not in self._static:
            broken = violations(self.workload, s)
            outside = self.space.outside(s)
            if broken:
                verdict = Verdict(False, "invalid", "; ".join(map(str, broken)))
            elif outside:
                verdict = Verdict(False, "outside-space", outside[0])
            elif self._measurable is not None and sig not in self._measurable:
                verdict = Verdict(False, "not-measurable", "the launcher has no measurement of this configuration")
            else:
                verdict = ADMIT
            self._static[sig] = verdict
        return self._static[sig]

    def check(self, s: Strategy, history: list[Trial], prior: list[Trial] = (), *, retry: bool = False) -> Verdict:
        """`retry`: the same configuration again after a transient failure (a duplicate is no refusal)."""
        if not retry:
            return self.check_all([s], history, prior)[0]
        static = self._static_check(s)
        if not static.admitted:
            return static
        return self._check_against(s, self._history_view(history, prior), retry=True)

    def check_all(self, candidates: Sequence[Strategy], history: list[Trial], prior: Sequence[Trial] = ()
                  ) -> list[Verdict]:
        """`check` of each candidate, in order: a pass over the pool looks the trials and the fit up once.
        The analysis and the stopping rule each pass over the whole pool with the same trials and the
        same fit: the second pass reads the first's verdicts."""
        view = self._history_view(history, prior)
        fit_id, cached = self.model.fit_id, view.verdicts
        out = []
        for s in candidates:
            sig = s.signature()
            static = self._static_check(s)
            if not static.admitted:
                out.append(static)
                continue
            verdict = cached.get((fit_id, sig))
            if verdict is None:
                verdict = cached[(fit_id, sig)] = self._check_against(s, view, retry=False)
            out.append(verdict)
        return out

    def _check_against(self, s: Strategy, view: _HistoryView, *, retry: bool) -> Verdict:
        """The checks that depend on the trials and the model's current fit."""
        launch = s.launch_key()
        if not retry and launch in view.first_launch:
            return Verdict(False, "duplicate", _duplicate_text(s, view.first_launch[launch]))
        # Earlier jobs' failures under another framework (before an upgrade) are hints, not refusals:
        # a configuration that ran out of memory then may fit now.
        trials = view.trials
        layout = None  # the candidate's layout, looked up at the first OOM that may share it
        for f in view.failed:
            t = f.trial
            if f.lasting and f.launch == launch and not retry:
                return Verdict(False, "known-failure", f"failed before ({t.failure.summary})")
            if f.refused and _shares_blamed_values(s, t):
                return Verdict(False, "known-failure", f"shares {_setting_text(t)} with trial {t.index}, which "
                                                       f"the framework refused ({t.failure.summary})")
            # Both OOM rules below are about the OOM's own layout: one comparison rules most candidates out.
            if f.oom_layout is not None and f.launch != launch \
                    and f.oom_layout == (layout := layout or _layout_key(s)):
                if needs_at_least_as_much_memory(s, t.strategy, self.workload):
                    return Verdict(False, "implied-oom", f"needs at least the memory of {t.strategy.short()}, "
                                                         f"which ran out of memory")
                saving = self._saving(s, t.strategy)
                if saving is not None and saving < SMALL_SAVING * self.model.limit_gib \
                        and not self._sibling_fitted(s, trials):
                    return Verdict(False, "implied-oom", f"same layout as {t.strategy.short()}, which ran out of "
                                                         f"memory, and saves only {saving:.1f} GiB")
        if self.model.predicted_oom(s):
            return Verdict(False, "predicted-oom",
                           f"predicted {self.model.mem_gib(s):.1f} GiB > {self.model.limit_gib:.1f} GiB "
                           f"limit (+{self.model.constants.oom_margin:.0%} margin)")
        if not view.stale:
            return ADMIT
        hint = next((t for t in view.stale
                     if t.strategy.launch_key() == launch and t.status == TrialStatus.FAILED and t.failure),
                    None)
        if hint is not None:
            return Verdict(True, "hint", f"failed under {describe(framework_of(hint.fingerprint))} "
                                         f"({hint.failure.summary}); the framework changed since, so it is tried")
        return ADMIT

    def _saving(self, s: Strategy, oom: Strategy) -> float | None:
        """GiB the model expects `s` to save over `oom` when both share a parallel layout, else None."""
        if not _same_layout(s, oom):
            return None
        return self.model.base(oom).mem_gib - self.model.base(s).mem_gib

    def _sibling_fitted(self, s: Strategy, trials: list[Trial]) -> bool:
        """A run of the same layout that the model expects to need at least as much memory as `s` fitted:
        the OOM next to it was measurement noise near the limit, not the layout."""
        need = self.model.base(s).mem_gib
        return any(t.status == TrialStatus.OK and _same_layout(t.strategy, s)
                   and self.model.base(t.strategy).mem_gib >= need for t in trials)

    def admissible(self, s: Strategy, history: list[Trial], prior: list[Trial] = ()) -> bool:
        return self.check(s, history, prior).admitted

"""A tick's verdict, as a pure function of what it found: no I/O, so every branch is tested directly.

    no incumbent ───────────────────────────► first-tune    (tune; the result becomes the incumbent)
    framework as when the incumbent was measured ► no-change (nothing to re-measure, nothing started)
    changed, |change| <= noise band ─────────► within-noise (retune only if the schedule says always)
    changed, slower beyond the band ─────────► regression   (retune)
    changed, faster beyond the band ─────────► improvement  (retune: the best may have moved too)

`regression_pct` is (before - after) / before in percent: positive when the incumbent got slower,
negative when it got faster, 100 when it no longer runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from optico.pool.records import Incumbent
from optico.retune.remeasure import Remeasurement

Outcome = Literal["first-tune", "no-change", "within-noise", "regression", "improvement"]
OUTCOMES: tuple[Outcome, ...] = ("first-tune", "no-change", "within-noise", "regression", "improvement")


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    fingerprint_changed: bool
    retune: bool  # start a retune job
    mfu_before: float | None = None
    mfu_after: float | None = None
    regression_pct: float | None = None
    noise_pct: float | None = None


def framework_changed(incumbent: Incumbent | None, probed: dict[str, str]) -> bool:
    """The framework differs from the one the incumbent was measured under (no incumbent: it counts as
    changed — there is nothing it could be compared with)."""
    return incumbent is None or dict(incumbent.fingerprint) != dict(probed)


def decide(incumbent: Incumbent | None, probed: dict[str, str], remeasured: Remeasurement | None = None, *,
           always_retune: bool = False) -> Decision:
    """The verdict. `remeasured` is needed exactly when the framework changed under an incumbent."""
    if incumbent is None:
        return Decision("first-tune", fingerprint_changed=True, retune=True)
    before = incumbent.mfu
    if not framework_changed(incumbent, probed):
        return Decision("no-change", fingerprint_changed=False, retune=False, mfu_before=before)
    if remeasured is None:
        raise ValueError("decide: the framework changed; the incumbent must be re-measured first")
    if remeasured.broken:
        return Decision("regression", fingerprint_changed=True, retune=True, mfu_before=before,
                        mfu_after=remeasured.mean_mfu, regression_pct=100.0)
    after, band = remeasured.mean_mfu or 0.0, remeasured.noise_pct or 0.0  # both set: not broken
    pct = (before - after) / before * 100 if before > 0 else 0.0
    if abs(pct) <= band:
        outcome: Outcome = "within-noise"
    else:
        outcome = "regression" if pct > 0 else "improvement"
    return Decision(outcome, fingerprint_changed=True, retune=outcome != "within-noise" or always_retune,
                    mfu_before=before, mfu_after=after, regression_pct=pct, noise_pct=band)

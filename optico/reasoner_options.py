"""The reasoner options `optico tune` and `optico bench` share: `--ablate` and the LLM settings an LLM
reasoner needs, both checked before anything runs."""

from __future__ import annotations

from optico.errors import SpecError
from optico.spec import ABLATIONS, ReasonerSpec
from optico.terminal import fail


def ablations_option(text: str, option: str = "--ablate") -> list[str]:
    """`--ablate a,b`: the paper's ablations, each known (tune and bench read it alike)."""
    wanted = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in wanted if a not in ABLATIONS]
    if unknown:
        raise SpecError(option, f"unknown ablation {unknown[0][:40]!r} ({', '.join(ABLATIONS)})")
    return wanted


def check_llm_settings(reasoner: ReasonerSpec) -> None:
    """Fails fast, naming the OPTICO_LLM_* variable, when an LLM reasoner cannot be built (a job, or a
    benchmark, would otherwise fall back to the rules on every call, or report OptiCo at 0 %)."""
    if reasoner.uses_llm:
        from optico.llm.settings import load_settings

        try:
            load_settings()
        except ValueError as exc:
            kind = reasoner.analysis if reasoner.analysis != "rules" else reasoner.generation
            fail(f"reasoner {kind}: {exc}")

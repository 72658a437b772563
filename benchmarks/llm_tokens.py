"""Tokens and cost per iteration of the LLM reasoners, per mode, as the job's history grows (10 -> 200 rows).

The pool's history table grows every iteration; the prompts get the compact view
(`optico.llm.history`), cut to a token budget, so what one iteration sends should stay
flat. For each history size N this script builds a job history of N simulated trials
(distinct configurations drawn from the search space, run by the simulator launcher —
OOMs, Megatron assertion errors and hangs included — failures diagnosed by the offline
rules), then runs one iteration of the LLM reasoners on it — analysis, generation and the
diagnosis of the latest failure — through the real `openai` client, and reports the
prompt and completion tokens each call recorded in its audit message.

By default the endpoint is the scripted OpenAI-compatible server of the test suite
(tests/llm/fake_openai.py; its usage counts are 4 characters per token). With --live the
OPTICO_LLM_* settings are used instead (real usage counts from a real model).

    python benchmarks/llm_tokens.py [--spec examples/llama3-8b-a100.yaml] [--rows 10,50,100,200]
        [--modes model-guided,llm-led] [--ablate history,cot] [--price-of gpt-4.1-mini] [--live] [--json]

Each mode is measured with its own prompts (model-guided: the compact view and the performance
model's candidates; llm-led: the full history table, compressed past its budget). The cost per
iteration uses the list price of `--price-of` (the scripted server is free).

This is a measurement, not a test: it prints a table and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "llm"))  # the scripted server

from optico.agents.analysis import RulesAnalysis  # noqa: E402
from optico.agent_contracts import AnalysisInput, FailureInput, GenerationInput  # noqa: E402
from optico.agents.failure import RulesFailureAnalysis  # noqa: E402
from optico.agents.llm import build_llm_reasoners  # noqa: E402
from optico.guard import Guard  # noqa: E402
from optico.launchers.sim import SimLauncher  # noqa: E402
from optico.llm.settings import load_settings  # noqa: E402
from optico.perfmodel.online import JobModel  # noqa: E402
from optico.spec import JobSpec, ReasonerSpec, load_spec  # noqa: E402
from optico.trial import Trial, TrialStatus  # noqa: E402


def simulated_history(spec: JobSpec, pool: list, n: int, seed: int = 0) -> list[Trial]:
    """`n` trials of distinct configurations, oldest first, as the pool would hold them."""
    rng = random.Random(seed)
    launcher = SimLauncher(seed=seed, hang_rate=0.05)
    rules = RulesFailureAnalysis()
    picks = rng.sample(pool, n)
    trials = []
    for i, s in enumerate(picks, start=1):
        r = asyncio.run(launcher.launch(spec.workload, s, trial_key=f"bench-trial{i}"))
        failure = None
        if not r.ok:
            failure = rules.diagnose(FailureInput(workload=spec.workload, strategy=s, log=r.log,
                                                  category_hint=r.category_hint, iteration=i))
        trials.append(Trial(id=i, job_id=1, index=i, strategy=s, signature=s.signature(),
                            status=TrialStatus.OK if r.ok else TrialStatus.FAILED, metrics=r.metrics,
                            failure=failure, rationale="benchmark history", log_excerpt=r.log[-4000:]))
    return trials


def measure(spec: JobSpec, rows: list[int], settings_overrides: dict[str, Any], mode: str = "model-guided",
            ablate: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    spec = spec.model_copy(update={"reasoner": ReasonerSpec.every(mode, ablate=ablate)})
    model = JobModel(spec.workload)
    pool = list(spec.search_space.enumerate(spec.workload))
    model.prime(pool)
    guard = Guard(spec.workload, spec.search_space, model)
    calls: list[dict[str, Any]] = []

    def record(agent: str, iteration: int, kind: str, content: dict, text: str = "") -> None:
        calls.append({"agent": agent, "iteration": iteration, "kind": kind, **content})

    out = []
    for n in rows:
        history = simulated_history(spec, pool, n)
        ok = [t for t in history if t.status == TrialStatus.OK]
        reference = max(ok, key=lambda t: t.metrics.mfu).strategy if ok else history[-1].strategy
        rules_analysis = RulesAnalysis(model, guard, pool)
        llm = build_llm_reasoners(spec, rules_analysis, record, settings=load_settings(**settings_overrides))
        calls.clear()
        it = n + 1
        inp = AnalysisInput(workload=spec.workload, search_space=spec.search_space, history=history,
                            reference=reference, iteration=it)
        try:
            analysis = llm.analysis.analyze(inp)
        except Exception:  # an endpoint that failed: the rules answer, as in the loop
            analysis = rules_analysis.analyze(inp)
        try:
            llm.generation.generate(GenerationInput(workload=spec.workload, search_space=spec.search_space,
                                                    reference=reference, analysis=analysis, history=history,
                                                    iteration=it))
        except Exception:
            pass
        failed = next((t for t in reversed(history) if t.status == TrialStatus.FAILED), None)
        if failed is not None and "failure-analysis" not in ablate:  # the ablation asks no diagnosis
            try:
                llm.failure.diagnose(FailureInput(workload=spec.workload, strategy=failed.strategy,
                                                  reference=reference, log=failed.log_excerpt,
                                                  attempts=1, iteration=it))
            except Exception:
                pass
        llm.client.close()
        per_agent = {a: {"prompt": sum(c["prompt_tokens"] or 0 for c in calls if c["agent"] == a),
                         "completion": sum(c["completion_tokens"] or 0 for c in calls if c["agent"] == a),
                         "calls": sum(1 for c in calls if c["agent"] == a)}
                     for a in ("analysis", "generation", "failure")}
        hist = next((c["history"] for c in calls if c["agent"] == "analysis" and "history" in c), {})
        out.append({
            "rows": n, "failed_rows": sum(1 for t in history if t.status == TrialStatus.FAILED),
            "history_rows_shown": hist.get("history_rows"), "failure_kinds": hist.get("failure_kinds"),
            "failure_kinds_shown": hist.get("failure_kinds_shown"),
            "history_tokens_est": hist.get("history_tokens_est"),
            **{f"{a}_{k}": v[k] for a, v in per_agent.items() for k in ("prompt", "completion", "calls")},
            "iteration_prompt": sum(v["prompt"] for v in per_agent.values()),
            "iteration_completion": sum(v["completion"] for v in per_agent.values()),
            "iteration_total": sum(v["prompt"] + v["completion"] for v in per_agent.values()),
            "calls": len(calls), "fallbacks": sum(1 for c in calls if c.get("fallback")),
        })
    return out


def growth(results: list[dict[str, Any]]) -> float:
    """Prompt tokens per iteration at the largest history against the smallest, as a fraction."""
    return results[-1]["iteration_prompt"] / results[0]["iteration_prompt"] - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(REPO / "examples" / "llama3-8b-a100.yaml"))
    ap.add_argument("--rows", default="10,50,100,200", help="History sizes, comma-separated.")
    ap.add_argument("--modes", default="model-guided,llm-led", help="Reasoner modes, comma-separated.")
    ap.add_argument("--ablate", default="", help="Ablations for every mode, comma-separated.")
    ap.add_argument("--price-of", default="gpt-4.1-mini", help="Model whose list price gives the cost.")
    ap.add_argument("--live", action="store_true", help="Use the OPTICO_LLM_* endpoint, not the scripted server.")
    ap.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    rows = [int(x) for x in args.rows.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    ablate = tuple(a.strip() for a in args.ablate.split(",") if a.strip())
    from optico.llm.settings import LLMSettings

    price = LLMSettings(model=args.price_of).price(args.price_of) or (0.0, 0.0)
    results: dict[str, list[dict[str, Any]]] = {}
    for mode in modes:
        if args.live:
            results[mode] = measure(spec, rows, {}, mode, ablate)
        else:
            from fake_openai import FakeOpenAI

            with FakeOpenAI() as server:
                results[mode] = measure(spec, rows, {"base_url": server.url, "model": "fake-model",
                                                     "api_key": "unused"}, mode, ablate)
        for r in results[mode]:
            r["cost_usd"] = round((r["iteration_prompt"] * price[0] + r["iteration_completion"] * price[1]) / 1e6, 5)
    if args.json:
        print(json.dumps({"price_of": args.price_of, "ablate": list(ablate), "modes": results,
                          "growth": {m: round(growth(r), 4) for m, r in results.items()}}, indent=2))
        return
    print(f"spec {Path(args.spec).name}; tokens per iteration (prompt tokens per agent; total = prompts + "
          f"completions of analysis, generation and one failure diagnosis); cost at {args.price_of} prices"
          + (f"; ablations: {', '.join(ablate)}" if ablate else ""))
    for mode, res in results.items():
        head = (f"{'rows':>5} {'failed':>6} {'shown':>5} {'fail kinds':>10} {'hist tok':>8} | {'analysis':>8} "
                f"{'generation':>10} {'failure':>7} | {'prompt/it':>9} {'total/it':>8} {'USD/it':>8}")
        print(f"\n{mode}: prompt tokens per iteration {growth(res):+.1%} from {res[0]['rows']} to "
              f"{res[-1]['rows']} rows")
        print(head)
        print("-" * len(head))
        for r in res:
            kinds = f"{r['failure_kinds_shown']}/{r['failure_kinds']}"
            print(f"{r['rows']:>5} {r['failed_rows']:>6} {r['history_rows_shown'] or 0:>5} "
                  f"{kinds:>10} {r['history_tokens_est'] or 0:>8} | "
                  f"{r['analysis_prompt']:>8} {r['generation_prompt']:>10} {r['failure_prompt']:>7} | "
                  f"{r['iteration_prompt']:>9} {r['iteration_total']:>8} {r['cost_usd']:>8.5f}")


if __name__ == "__main__":
    main()

"""The benchmark's outputs: a Markdown report, the JSON document, the convergence plot."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from optico.bench.metrics import AT_BUDGETS

# The goals for OptiCo, checked in every report.
GOAL_FRAC_AT_10 = 0.99
GOAL_SPEEDUP = 3.0
GOAL_FAILED = 0.10


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.{digits}f}"


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals for the `optico` tuner: value, target, met."""
    t = doc["tuners"]
    o = t.get("optico")
    if not o:
        return []
    budget = doc["meta"]["budget"]
    out = [{"goal": "OptiCo best within 10 trials, fraction of the optimum (median)",
            "value": o["frac_of_opt_at"]["10"], "target": f">= {GOAL_FRAC_AT_10:.0%}",
            "met": (o["frac_of_opt_at"]["10"] or 0) >= GOAL_FRAC_AT_10}]
    for other in ("optuna", "random"):
        if t.get(other) and o["trials_to_98"]:
            ratio = t[other]["trials_to_98"] / o["trials_to_98"]
            bound = " (a lower bound: the median run never got there; budget + 1 counted)" \
                if t[other]["trials_to_98"] > budget else ""
            out.append({"goal": f"trials to 98 % of the optimum, {other} / OptiCo", "value": ratio,
                        "target": f">= {GOAL_SPEEDUP:.0f}x", "met": ratio >= GOAL_SPEEDUP,
                        "detail": f"{_num(t[other]['trials_to_98'])} vs {_num(o['trials_to_98'])}{bound}"})
    out.append({"goal": "OptiCo failed trials (median fraction)", "value": o["failed_frac"],
                "target": f"<= {GOAL_FAILED:.0%}", "met": (o["failed_frac"] or 0) <= GOAL_FAILED})
    return out


def result_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The JSON written by `--json`: the issue's schema plus goals, curves and metadata (every
    trial of every run is left to `--trials`)."""
    return {**{k: v for k, v in doc.items() if k != "runs"}, "goals": goals(doc)}


def markdown(doc: dict[str, Any]) -> str:
    meta, tuners = doc["meta"], doc["tuners"]
    agreement = any("model_agreement" in e["landscape"] for e in doc["landscapes"])
    lines = [f"Budget {meta['budget']} trials, {meta['seeds']} seeds, {meta['landscapes']} landscapes; "
             f"medians over seeds, then over landscapes. Wall {meta['wall_seconds']:.0f} s, CPU "
             f"{meta['cpu_seconds']:.0f} s, {meta['jobs']} worker(s) on {meta['cpus']} CPU(s).", ""]
    head = ["tuner"] + [f"best @{b}" for b in AT_BUDGETS] + ["trials to 98 %", "trials to expert",
                                                             "failed", "GPU-hours", "runs reaching 98 %"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for name, f in tuners.items():
        if f is None:
            continue
        row = [f"**{name}**" if name == "optico" else name]
        row += [_pct(f["frac_of_opt_at"][str(b)]) for b in AT_BUDGETS]
        row += [_num(f["trials_to_98"]), _num(f["trials_to_expert"]), _pct(f["failed_frac"]),
                _num(f["gpu_hours"]), _pct(f.get("reached_98"))]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"`best @k`: best configuration found within k trials, as a fraction of the landscape's "
                  f"optimum (true MFU). Never reaching a threshold counts as budget + 1 = {meta['budget'] + 1}.", ""]
    if agreement:
        lines += ["`model pick`: the true MFU of the configuration the tuner's performance model likes best before "
                  "any measurement (fraction of the optimum; 0 % = it fails there). `model ρ top 5 %`: Spearman "
                  "rank correlation of the model with the landscape over the model's top 5 %.", ""]
    gl = goals(doc)
    if gl:
        lines += ["Goals:", ""]
        for g in gl:
            value = f"{g['value']:.1f}x" if "x" in g["target"] else _pct(g["value"])
            detail = f" ({g['detail']})" if g.get("detail") else ""
            lines.append(f"- {g['goal']}: {value}{detail}, target {g['target']} — "
                         f"{'met' if g['met'] else 'NOT met'}")
        lines.append("")
    names = [n for n in tuners if tuners[n] is not None]
    head = ["landscape", "configs", "optimum MFU", "expert"]
    head += ["model pick", "model ρ top 5 %"] if agreement else []
    head += [f"{n} @10 / →98" for n in names if n != "expert"]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for e in doc["landscapes"]:
        expert = _pct(e["expert_mfu"] / e["optimum_mfu"]) if e["expert_mfu"] else (
            "fails" if e["landscape"]["expert"] else "–")
        row = [e["name"], str(e["landscape"]["configurations"]), _pct(e["optimum_mfu"]), expert]
        if agreement:
            a = e["landscape"].get("model_agreement") or {}
            rho = a.get("spearman_top5")
            row += [_pct(a.get("model_pick")), "–" if rho is None else f"{rho:.2f}"]
        for n in names:
            if n == "expert":
                continue
            f = e["tuners"].get(n)
            row.append(f"{_pct(f['frac_of_opt_at']['10'])} / {_num(f['trials_to_98'])}" if f else "–")
        lines.append("| " + " | ".join(row) + " |")
    if doc.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(f"{s['name']} ({s['reason']})" for s in doc["skipped"])]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    _write(Path(path), json.dumps(result_document(doc), indent=1, default=float) + "\n")


def plot(doc: dict[str, Any], path: str | Path) -> None:
    """Best so far (fraction of the optimum) against trials, one line per tuner: the median over
    all runs, quartiles shaded (not for grid and expert, whose quartiles span the axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = doc["meta"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    styles = {"optico": ("#d62728", 2.6), "optuna": ("#1f77b4", 1.6), "random": ("#7f7f7f", 1.6),
              "grid": ("#bcbd22", 1.6), "expert": ("#2ca02c", 1.4)}
    for name, band in doc["curves"].items():
        if not band["median"]:
            continue
        xs = list(range(1, len(band["median"]) + 1))
        color, width = styles.get(name, (None, 1.6))
        ls = "--" if name == "expert" else "-"
        ax.plot(xs, band["median"], ls, color=color, lw=width, label=name)
        if name not in ("grid", "expert"):  # their quartiles span the whole axis and hide the rest
            ax.fill_between(xs, band["q25"], band["q75"], color=color, alpha=0.12, lw=0)
    ax.axhline(0.98, color="k", lw=0.6, ls=":")
    ax.set_xlabel("trial")
    ax.set_ylabel("best so far / landscape optimum (true MFU)")
    ax.set_ylim(0.5, 1.01)
    ax.set_xlim(1, meta["budget"])
    ax.set_xticks(range(1, meta["budget"] + 1, 1 if meta["budget"] <= 20 else 5))
    ax.set_title(f"OptiCo vs black-box search: {meta['landscapes']} landscapes x {meta['seeds']} seeds "
                 f"(median; quartiles shaded)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)

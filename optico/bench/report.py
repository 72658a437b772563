"""The benchmark's outputs: a Markdown report, the JSON document, the convergence plot."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from optico.bench.summary import goals
from optico.textsafe import markdown_text

GROUP_TITLES = {
    "independent": "Independent: llm-analysis landscapes (a third-party simulator)",
    "out-of-form": "Out-of-form: the simulated family plus effects the model has no term for",
    "real": "Real: measured tables, replayed (OptiCo calibrated without them)",
    "self": "Sanity check only: landscapes drawn from OptiCo's own performance model",
}


def _cell(text: str) -> str:
    """A name or reason (from a CSV cell, a file name, an exception) as one Markdown table cell."""
    return markdown_text(text, max_chars=500)


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}"


def _ci(f: dict[str, Any] | None) -> str:
    if not f or f.get("mean") is None:
        return "–"
    return f"{_pct(f['mean'])} [{_pct(f['lo'])}, {_pct(f['hi'])}]"


def _diff(d: dict[str, Any]) -> str:
    ahead = (f", ahead on {d['strata_ahead']} / behind on {d['strata_behind']} of {d['strata']} landscapes"
             if d.get("strata") else "")
    return (f"{100 * d['mean']:+.1f} pt [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}], p = {d['p']:.2g} over runs, "
            f"wins {d['wins']:.0%} / losses {d['losses']:.0%} of runs{ahead}")


def _group_order(doc: dict[str, Any]) -> list[str]:
    fixed = [g for g in ("independent", "out-of-form", "real") if g in doc["groups"]]
    sweeps = sorted(g for g in doc["groups"] if g.startswith("sweep"))
    return fixed + sweeps + (["self"] if "self" in doc["groups"] else [])


def group_table(doc: dict[str, Any], group: str) -> list[str]:
    g = doc["groups"][group]
    budget = doc["meta"]["budget"]
    head = ["tuner", "best @5", "best @10 [95 % CI]", f"best @{budget}", "AUC [95 % CI]", "→98 % by 10",
            f"→98 % by {budget}", "failed launches", "of which OOM", "launches", "GPU-h", "best @ equal GPU-h"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, f in sorted(g["tuners"].items(), key=lambda kv: -(kv[1]["best_at"]["10"]["mean"] or 0)):
        label = f"**{name}**" if name == "optico" else (f"{name} (strongest baseline)" if name == g["strongest"]
                                                        else name)
        at_budget = f["best_at"].get(str(budget)) or f["best_at"]["20"]
        lines.append("| " + " | ".join([
            label, _pct(f["best_at"]["5"]["mean"]), _ci(f["best_at"]["10"]), _pct(at_budget["mean"]), _ci(f["auc"]),
            _pct(f["reached_98_at_10"]["mean"], 0) + " %", _pct(f["reached_98"]["mean"], 0) + " %",
            _pct(f["failed_launches"]) + " %", _pct(f["oom_launches"]) + " %",
            f"{f['launches']:.1f}", f"{f['gpu_hours']:.1f}",
            _pct(f["best_equal_gpu_hours"]["mean"])]) + " |")
    pairs = g["paired"].get("optico", {})
    if g["strongest"] and g["strongest"] in pairs:
        lines += ["", f"OptiCo − {g['strongest']} (paired by landscape and seed): best @10 "
                      f"{_diff(pairs[g['strongest']]['best_at_10'])}; AUC {_diff(pairs[g['strongest']]['auc'])}."]
    c = g.get("ceiling")
    if c:
        lines += ["", f"Clairvoyant ceiling (every effect known but each configuration's own; expected over fresh "
                      f"draws of those, on {c['landscapes']} of {c['of']} landscapes): best @10 "
                      f"{_pct(c['best_at_10'])}, @{budget} {_pct(c.get(f'best_at_{budget}'))}; →98 % by 10 "
                      f"{_pct(c['reached_98_at_10'], 0)} %, by {budget} {_pct(c.get(f'reached_98_at_{budget}'), 0)} %."]
    return lines


def sweep_table(doc: dict[str, Any]) -> list[str]:
    sweeps = sorted(g for g in doc["groups"] if g.startswith("sweep"))
    if not sweeps:
        return []
    others = sorted({o for g in sweeps for o in doc["groups"][g]["paired"].get("optico", {})})
    lines = ["| effect size | ceiling @10 | OptiCo best @10 | " + " | ".join(f"− {o}" for o in others) + " |",
             "|---:|---:|---:|" + "---:|" * len(others)]
    for g in sweeps:
        grp = doc["groups"][g]
        row = [g.split()[-1], _pct((grp.get("ceiling") or {}).get("best_at_10")),
               _ci(grp["tuners"]["optico"]["best_at"]["10"]) if "optico" in grp["tuners"] else "–"]
        for o in others:
            d = grp["paired"].get("optico", {}).get(o)
            row.append("–" if d is None else f"{100 * d['best_at_10']['mean']:+.1f} "
                                             f"[{100 * d['best_at_10']['lo']:+.1f}, {100 * d['best_at_10']['hi']:+.1f}]")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    held = "yes" if meta.get("frozen") else "NO (the tuner's constants changed after the test seeds were drawn)"
    lines = [f"Budget {meta['budget']} launches, {meta['seeds']} seeds per landscape, {meta['landscapes']} landscapes "
             f"(landscape seed {meta.get('landscape_seed')}, {'development' if meta.get('dev') else 'test'} draw; "
             f"tuner constants frozen before it: {held}). Wall {meta['wall_seconds']:.0f} s, CPU "
             f"{meta['cpu_seconds']:.0f} s, {meta['jobs']} worker(s) on {meta['cpus']} CPU(s).", "",
             "Figures are means over runs (landscape x seed) in % of each landscape's optimum, with bootstrap 95 % "
             "intervals for landscapes of the group's kind (landscapes resampled, then seeds within them); AUC = "
             "mean best-so-far over the budget; →98 % = share of runs whose best reached 98 % of the optimum; "
             "failed launches = failed / all launches (of which OOM: out of memory; hangs come at the landscape's "
             "own rate).", ""]
    for group in _group_order(doc):
        title = GROUP_TITLES.get(group, f"Out-of-form effects of size {group.split()[-1]} (sensitivity sweep)")
        lines += [f"### {title}", "", f"{len(doc['groups'][group]['landscapes'])} landscapes.", ""]
        lines += group_table(doc, group) + [""]
    sw = sweep_table(doc)
    if sw:
        lines += ["### Sensitivity: OptiCo − each baseline, best @10 (pt, 95 % CI) by out-of-form effect size", ""]
        lines += sw + [""]
    gl = goals(doc)
    if gl:
        lines += ["Goals (issue 13):", ""]
        for g in gl:
            ci = f" [{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}]" if "lo" in g else ""
            value = f"{100 * g['value']:+.1f} pt{ci}" if "lo" in g else _pct(g["value"]) + " %"
            lines.append(f"- {g['group']}: {g['goal']}: {value} — {'met' if g['met'] else 'NOT met'}"
                         + (f" ({g['detail']})" if g.get("detail") else ""))
        lines.append("")
    names = [n for n in meta["tuners"] if n != "expert"]
    head = (["landscape", "group", "configs", "optimum MFU", "model ρ", "model pick", "≥98 % (model rank)",
             "ceiling @10"] + [f"{n} @10" for n in names])
    lines += ["Per landscape: mean best @10 (% of optimum).", "",
              "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for e in doc["landscapes"]:
        a = e["landscape"].get("model_agreement") or {}
        rho = a.get("spearman")
        row = [_cell(e["name"]), e["group"], str(e["landscape"]["configurations"]), _pct(e["optimum_mfu"]),
               "–" if rho is None else f"{rho:.2f}", _pct(a.get("model_pick")), _near_optimal(a),
               _pct((e["landscape"].get("ceiling") or {}).get("best_at_10"))]
        row += [_pct(e["tuners"][n]["best_at_10"]) if n in e["tuners"] else "–" for n in names]
        lines.append("| " + " | ".join(row) + " |")
    if doc.get("skipped"):
        lines += ["", "Refused or skipped: " + "; ".join(f"{_cell(s['name'])} ({_cell(s['reason'])})"
                                                    for s in doc["skipped"])]
    return "\n".join(lines) + "\n"


def _near_optimal(agreement: dict[str, Any]) -> str:
    """"n (#r)": n configurations reach 98 % of the optimum, the first at rank r of the model's order."""
    if agreement.get("near_optimal") is None:
        return "–"
    rank = agreement.get("model_rank_98")
    return f"{agreement['near_optimal']} (#{rank})" if rank is not None else f"{agreement['near_optimal']} (–)"


def result_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The JSON written by `--json`: groups, landscapes, goals, metadata (every trial: `--trials`)."""
    return {**{k: v for k, v in doc.items() if k != "runs"}, "goals": goals(doc)}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    _write(Path(path), json.dumps(result_document(doc), indent=1, default=float) + "\n")


STYLES = {"optico": ("#d62728", 2.6), "model-greedy": ("#9467bd", 1.6), "model-rank": ("#8c564b", 1.4),
          "gp-warm": ("#17becf", 1.6), "tpe-warm": ("#1f77b4", 1.6), "tpe": ("#aec7e8", 1.4),
          "random-fit": ("#7f7f7f", 1.2), "random": ("#c7c7c7", 1.2)}


def plot(doc: dict[str, Any], path: str | Path) -> None:
    """Mean best so far (fraction of the optimum) against launches, one panel per group (sweeps left
    out), one line per tuner; and the ECDF of trials to 98 % below each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g for g in _group_order(doc) if not g.startswith("sweep")]
    budget = doc["meta"]["budget"]
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 6.4), dpi=110, squeeze=False)
    for j, group in enumerate(groups):
        top, bottom = axes[0][j], axes[1][j]
        for name, f in doc["groups"][group]["tuners"].items():
            if name == "expert" or (name.startswith("optico-")):
                continue
            color, width = STYLES.get(name, (None, 1.2))
            xs = list(range(1, len(f["curve"]) + 1))
            top.plot(xs, f["curve"], color=color, lw=width, label=name)
            bottom.step(list(range(1, len(f["ecdf_98"]) + 1)), f["ecdf_98"], where="post", color=color, lw=width)
        top.axhline(0.98, color="k", lw=0.6, ls=":")
        top.set_ylim(0.7, 1.005)
        top.set_xlim(1, budget)
        top.set_title(group, fontsize=9)
        top.grid(alpha=0.3)
        bottom.set_ylim(0, 1.02)
        bottom.set_xlim(1, budget)
        bottom.set_xlabel("launch")
        bottom.grid(alpha=0.3)
        if j == 0:
            top.set_ylabel("mean best so far / optimum")
            bottom.set_ylabel("share of runs at 98 %")
    axes[0][0].legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)

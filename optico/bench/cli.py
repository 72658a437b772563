"""`optico bench`: every tuner on every landscape, side by side (registered in optico.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from optico.bench.suite import DEFAULT_TUNERS

console = Console()
err = Console(stderr=True)


def bench(
    suite: str = typer.Option("all", "--suite", help="Landscape groups: all, independent, out-of-form, real, self "
                                                      "(sim = every self-generated landscape, replay = the packaged "
                                                      "table)."),
    landscape: Optional[list[Path]] = typer.Option(None, "--landscape", metavar="FILE.csv",
                                                   help="Also replay every workload of this CSV (repeatable)."),
    more_landscapes: Optional[list[Path]] = typer.Argument(None, metavar="[FILE.csv ...]", show_default=False,
                                                           help="More landscape CSVs after the first --landscape "
                                                                "(so a shell glob works)."),
    tuners: str = typer.Option(",".join(DEFAULT_TUNERS), "--tuners",
                               help="Comma-separated tuners (expert is added where a landscape has one)."),
    budget: int = typer.Option(20, "--budget", help="Launches per tuner, landscape and seed."),
    seeds: int = typer.Option(20, "--seeds", help="Seeds 0..N-1 per tuner and landscape (run noise, hangs)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the figures as JSON here."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write the convergence plot (PNG) here."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Write the Markdown report here."),
    trials_path: Optional[Path] = typer.Option(None, "--trials", help="Write every trial of every run (JSON)."),
    jobs: int = typer.Option(2, "--jobs", help="Worker processes (landscapes run in parallel)."),
    only: Optional[list[str]] = typer.Option(None, "--only", help="Keep landscapes whose name contains this "
                                                                  "(repeatable)."),
    reasoner: str = typer.Option("rules", "--reasoner", help="OptiCo's reasoners: rules, model-guided or llm-led."),
    ablate: Optional[str] = typer.Option(None, "--ablate", metavar="LIST", help="The paper's ablations for "
                                         "OptiCo, comma-separated: history, failure-analysis, cot, confidence."),
    fidelity: bool = typer.Option(True, "--fidelity/--no-fidelity", help="Report how far the tuner's model is "
                                                                         "from each landscape."),
    all_clusters: bool = typer.Option(False, "--all-clusters", help="The self-generated (--suite sim) and "
                                      "out-of-form families on every preset, 8, 16 and 64 GPUs of both kinds."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Also run the out-of-form family at these effect "
                                                              "sizes (comma-separated, e.g. 0,0.05,0.1,0.15,0.2)."),
    ablations: bool = typer.Option(False, "--ablations", help="Also run OptiCo with each of its parts off."),
    quick: bool = typer.Option(False, "--quick", help="A few landscapes of each group, 5 seeds, the main tuners "
                                                      "(under a minute on 2 cores)."),
    dev: bool = typer.Option(False, "--dev", help="Development landscapes (for tuning), not the frozen test draw."),
) -> None:
    """Benchmark OptiCo against the baselines a competent user would run (docs/benchmarks.md)."""
    from optico.bench.report import markdown, plot, write_json
    from optico.bench.suite import landscape_seed, run_benchmark, select_landscapes
    from optico.bench.tuners import ABLATIONS
    from optico.spec import ReasonerSpec

    names = [t.strip() for t in tuners.split(",") if t.strip()]
    if ablations:
        names += [a for a in ABLATIONS if a not in names]
    if quick:
        seeds = min(seeds, 5)
        names = [n for n in names if n not in ("gp-warm", "random", "tpe")] if tuners == ",".join(DEFAULT_TUNERS) \
            else names
    try:
        sizes = [float(x) for x in sweep.split(",") if x.strip()] if sweep else []
        if any(x < 0 for x in sizes):
            raise ValueError("--sweep: effect sizes must be >= 0")
        csvs = [str(p) for p in [*(landscape or []), *(more_landscapes or [])]]
        defs = select_landscapes(suite, csvs, only or [], all_clusters=all_clusters,  # type: ignore[arg-type]
                                 dev=dev, sweep=sizes, quick=quick)
        spec = ReasonerSpec.every(reasoner, ablate=ablate or ())
    except ValueError as exc:  # pydantic's ValidationError is one
        exc = ValueError(f"--reasoner/--ablate: {exc.errors()[0]['msg']}") if hasattr(exc, "errors") else exc
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2)
    if not defs:
        err.print("[bold red]error:[/] no landscape selected", highlight=False)
        raise typer.Exit(2)
    console.print(f"{len(defs)} landscapes x {len(names)} tuners x {seeds} seeds, budget {budget}, "
                  f"{jobs} worker(s)")

    def done(r: dict[str, Any]) -> None:
        if "skipped" in r:
            console.print(f"  {r['name']}: refused ({r['skipped']})", highlight=False)
            return
        secs = " ".join(f"{k} {v:.1f}s" for k, v in r["seconds"].items())
        console.print(f"  {r['name']}: {r['landscape']['configurations']} configurations, optimum "
                      f"{r['landscape']['optimum_mfu']:.1%} — {secs}", highlight=False)

    try:
        doc = run_benchmark(defs, names, budget=budget, seeds=seeds, jobs=jobs, reasoner=spec,
                            fidelity=fidelity, on_done=done,
                            meta={"landscape_seed": landscape_seed(dev), "dev": dev, "suite": suite,
                                  "sweep": sizes, "quick": quick})
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2)
    # Files first: a report that fails to render must not lose a ten-minute run.
    if json_path:
        write_json(doc, json_path)
    if trials_path:
        trials_path.parent.mkdir(parents=True, exist_ok=True)
        trials_path.write_text(json.dumps(doc["runs"], indent=1, default=float) + "\n")
    if plot_path:
        plot(doc, plot_path)
    text = markdown(doc)
    if markdown_path:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(text)
    print(text)
    for label, path in (("figures", json_path), ("trials", trials_path), ("plot", plot_path),
                        ("report", markdown_path)):
        if path:
            console.print(f"{label} written to {path}", highlight=False)

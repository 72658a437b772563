"""`optico bench`: every tuner on every landscape, side by side (registered in optico.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from optico.bench import DEFAULT_TUNERS
from optico.reasoner_options import ablations_option, check_llm_settings
from optico.errors import SpecError, first_line
from optico.terminal import ANY_COUNT, check_output_path, console, fail, read_decimal, whole_number
from optico.textsafe import markup, terminal_text


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
    budget: int = typer.Option(20, "--budget", parser=whole_number(0, ANY_COUNT),
                               help="Launches per tuner, landscape and seed."),
    seeds: int = typer.Option(20, "--seeds", parser=whole_number(0, ANY_COUNT),
                              help="Seeds 0..N-1 per tuner and landscape (run noise, hangs)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the figures as JSON here."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write the convergence plot (PNG) here."),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Write the Markdown report here."),
    trials_path: Optional[Path] = typer.Option(None, "--trials", help="Write every trial of every run (JSON)."),
    jobs: int = typer.Option(2, "--jobs", parser=whole_number(0, ANY_COUNT),
                             help="Worker processes (landscapes run in parallel)."),
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
    from optico.bench.suite import landscape_seed, run_benchmark

    names, sizes, spec, defs = _checked_input(
        suite=suite, files=[*(landscape or []), *(more_landscapes or [])], tuners=tuners, budget=budget, seeds=seeds,
        outputs={"--json": json_path, "--plot": plot_path, "--markdown": markdown_path, "--trials": trials_path},
        jobs=jobs, only=only or [], reasoner=reasoner, ablate=ablate, all_clusters=all_clusters, sweep=sweep,
        ablations=ablations, quick=quick, dev=dev)
    _check_installed()
    if quick:
        seeds = min(seeds, 5)
    console.print(f"{len(defs)} landscapes x {len(names)} tuners x {seeds} seeds, budget {budget}, "
                  f"{jobs} worker(s)", highlight=False)

    def done(r: dict[str, Any]) -> None:
        # Landscape names carry file names; refusals quote them: escaped, never read as markup.
        if "skipped" in r:
            console.print(f"  {markup(r['name'], one_line=True)}: refused ({markup(r['skipped'], one_line=True)})",
                          highlight=False)
            return
        secs = " ".join(f"{k} {v:.1f}s" for k, v in r["seconds"].items())
        console.print(f"  {markup(r['name'], one_line=True)}: {r['landscape']['configurations']} configurations, "
                      f"optimum {r['landscape']['optimum_mfu']:.1%} — {markup(secs, one_line=True)}", highlight=False)

    try:
        doc = run_benchmark(defs, names, budget=budget, seeds=seeds, jobs=jobs, reasoner=spec,
                            fidelity=fidelity, on_done=done,
                            meta={"landscape_seed": landscape_seed(dev), "dev": dev, "suite": suite,
                                  "sweep": sizes, "quick": quick})
    except ValueError as exc:  # SpecError is one: a loader's refusal, found in a worker
        fail(exc if isinstance(exc, SpecError) else first_line(exc))
    if not doc["landscapes"]:
        # Every landscape refused when built (a table the calibration saw, too few configurations): no
        # figures to write (it exited 0 with an empty table and a JSON without groups).
        fail(SpecError("--landscape" if landscape or more_landscapes else "--only",
                       "every landscape selected was refused when built (the reasons are above); nothing ran"))
    # Files first: a report that fails to render must not lose a ten-minute run. The paths were
    # checked before the run; one that still cannot be written (a full disk, a file system that
    # refuses it) is reported once the report is printed.
    text = markdown(doc)
    failed: list[SpecError] = []

    def write_text(content: str) -> Callable[[Path], None]:
        def write(path: Path) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        return write

    written = []
    runs = json.dumps(doc["runs"], indent=1, default=float) + "\n" if trials_path else ""
    for label, option, path, write in (("figures", "--json", json_path, lambda p: write_json(doc, p)),
                                       ("trials", "--trials", trials_path, write_text(runs)),
                                       ("plot", "--plot", plot_path, lambda p: plot(doc, p)),
                                       ("report", "--markdown", markdown_path, write_text(text))):
        if path:
            try:
                write(path)
                written.append((label, path))
            except OSError as exc:
                failed.append(SpecError(option, f"cannot write {path}: {exc.strerror or first_line(exc)}"))
    print(terminal_text(text, max_chars=None))
    for label, path in written:
        console.print(f"{label} written to {markup(path, one_line=True)}", highlight=False)
    if failed:
        fail(failed[0])


# What the benchmark imports beyond OptiCo itself (the `bench` extra): Optuna's samplers (its GP sampler
# runs on torch) and the plot.
BENCH_PACKAGES = ("optuna", "torch", "matplotlib")


def _check_installed() -> None:
    """One line naming what cannot be imported, before anything runs (`make demo` installs OptiCo
    alone). Imported, not only looked up: the run imports them next anyway, and a broken install is
    as missing as an absent one."""
    import importlib

    missing = []
    for name in BENCH_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        fail(f"optico bench needs {', '.join(missing)}: run `make install-bench` in the repository, or "
             f"pip install 'optico[bench]'")


# Effect sizes of --sweep are log step-time std devs: 0.2 is already far beyond the model's error.
MAX_EFFECT_SIZE = 1.0
# Bounds on the run's size: every worker process starts up front (a --jobs of 100,000 is a fork
# bomb), and a run of a billion seeds never ends. `optico tune --max-trials` has the same cap.
MAX_JOBS = 64
MAX_SEEDS = 10_000
MAX_BUDGET = 10_000


def _checked_input(*, suite: str, files: list[Path], tuners: str, budget: int, seeds: int,
                   outputs: dict[str, Optional[Path]], jobs: int, only: list[str], reasoner: str,
                   ablate: Optional[str], all_clusters: bool, sweep: Optional[str], ablations: bool, quick: bool,
                   dev: bool) -> tuple[list[str], list[float], Any, list]:
    """Every option checked before anything runs: (tuner names, sweep sizes, reasoner spec, landscapes),
    or a one-line error naming the option (`fail`)."""
    from optico.bench.suite import select_landscapes
    from optico.bench.tuners import ABLATIONS, known_tuners, make_tuner
    from optico.perfmodel.constants import load_constants
    from optico.spec import ReasonerSpec

    for option, value, most in (("--budget", budget, MAX_BUDGET), ("--seeds", seeds, MAX_SEEDS),
                                ("--jobs", jobs, MAX_JOBS)):
        if not 1 <= value <= most:
            fail(SpecError(option, f"{value} is not allowed; give 1 to {most:,}"))
    names = [t.strip() for t in tuners.split(",") if t.strip()]
    if not names:
        fail(SpecError("--tuners", "no tuner named; give a comma-separated list, e.g. optico,model-greedy"))
    known = known_tuners()
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(SpecError("--tuners", f"unknown tuner {unknown[0]!r}; known: {', '.join(known)}"))
    if ablations:
        names += [a for a in ABLATIONS if a not in names]
    if quick and tuners == ",".join(DEFAULT_TUNERS):
        names = [n for n in names if n not in ("gp-warm", "random", "tpe")]
    sizes = _sweep_sizes(sweep) if sweep is not None else []
    try:
        spec = ReasonerSpec.every(reasoner, ablate=ablations_option(ablate) if ablate else ())
    except SpecError as exc:
        fail(exc)
    except ValueError as exc:  # pydantic's ValidationError is one: only the reasoner is left to refuse
        fail(SpecError("--reasoner", exc.errors()[0]["msg"] if hasattr(exc, "errors") else str(exc)))
    check_llm_settings(spec)  # without an endpoint every OptiCo run fell back, and the table said 0 %
    for option, path in outputs.items():
        if path is not None:
            check_output_path(path, option)
    try:
        load_constants()  # OPTICO_CALIBRATION: the tuners' model reads it in every worker
    except SpecError as exc:  # every refusal of a calibration file, naming where it came from
        fail(exc)
    try:
        defs = select_landscapes(suite, files, only, all_clusters=all_clusters,  # type: ignore[arg-type]
                                 dev=dev, sweep=sizes, quick=quick, strict=True)
        for calibration in sorted({c for d in defs if (c := getattr(d, "calibration", None))}):
            load_constants(calibration)  # a held-out calibration a replay landscape uses
        for name in names:
            make_tuner(name, spec)
    except SpecError as exc:
        fail(exc)
    except (ValueError, OSError, RecursionError) as exc:
        fail(first_line(exc))
    if not defs:
        if only:
            fail(SpecError("--only", f"no landscape name contains {' or '.join(map(repr, only))} "
                                     f"(--suite {suite}{', --quick' if quick else ''})"))
        fail(SpecError("--suite", f"no landscape selected by --suite {suite}"))
    return names, sizes, spec, defs


def _sweep_sizes(sweep: str) -> list[float]:
    """--sweep's effect sizes: finite numbers from 0 to MAX_EFFECT_SIZE."""
    sizes = []
    for part in sweep.split(","):
        if not part.strip():
            continue
        size = read_decimal(part.strip())
        if size is None:
            fail(SpecError("--sweep", f"{part.strip()[:40]!r} is not a number; give effect sizes such as 0,0.05,0.1"))
        if not 0 <= size <= MAX_EFFECT_SIZE:
            fail(SpecError("--sweep", f"effect size {part.strip()} is not between 0 and {MAX_EFFECT_SIZE:g}"))
        sizes.append(size)
    if not sizes:
        fail(SpecError("--sweep", "no effect size given; e.g. 0,0.05,0.1,0.15,0.2"))
    return sizes

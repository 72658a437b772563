"""Compare two tuners run by run from `optico bench --trials` files: a development experiment's figures.

Two versions of OptiCo cannot run side by side in one `optico bench` (one process imports one
version), so a variant is run alone on the same development landscapes and seeds, each writing
`--trials`, and the runs are paired by (landscape, seed):

    optico bench --dev --suite out-of-form --all-clusters --tuners optico,model-greedy --seeds 8 \
        --no-fidelity --trials base.json
    (cd variant-worktree && python -m optico.cli bench ... --tuners optico --trials variant.json)
    python benchmarks/paired_runs.py variant.json optico base.json optico

Prints, per figure, both means and the mean of the per-landscape paired difference with a bootstrap
95 % interval over landscapes (landscapes resampled; the seeds of one landscape share its draw).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Run = dict[str, Any]
# figure -> (how one run gives it, scale for printing)
FIGURES: dict[str, tuple[Callable[[Run], float], float]] = {
    "best @10": (lambda r: r["frac_of_opt_at"]["10"], 100),
    "best @20": (lambda r: r["frac_of_opt_at"]["20"], 100),
    "->98 % by 20": (lambda r: float(r["trials_to_98"] <= 20), 100),
    "failed launches": (lambda r: r["failed_frac"], 100),
    "OOM launches": (lambda r: r["oom"] / max(1, r["trials"]), 100),
    "launches": (lambda r: r["trials"], 1),
}


def runs(path: Path, tuner: str) -> dict[tuple[str, int], Run]:
    """(landscape, seed) -> run of `tuner` in an `optico bench --trials` file."""
    data = json.loads(path.read_text())
    return {(name, r["seed"]): r for name, tuners in data.items() for r in tuners.get(tuner, [])}


def paired(a: dict[tuple[str, int], Run], b: dict[tuple[str, int], Run], boots: int = 4000) -> list[str]:
    keys = sorted(set(a) & set(b))
    names = sorted({name for name, _ in keys})
    rng = np.random.default_rng(0)
    lines = [f"{len(names)} landscapes, {len(keys)} paired runs"]
    for label, (figure, scale) in FIGURES.items():
        per = np.array([np.mean([figure(a[k]) - figure(b[k]) for k in keys if k[0] == n]) for n in names])
        draws = [per[rng.integers(0, len(per), len(per))].mean() for _ in range(boots)]
        lo, hi = np.percentile(draws, [2.5, 97.5]) * scale
        mean_a, mean_b = (np.mean([figure(x[k]) for k in keys]) * scale for x in (a, b))
        lines.append(f"  {label:16s} {mean_a:7.2f} vs {mean_b:7.2f}   difference {per.mean() * scale:+.2f} "
                     f"[{lo:+.2f}, {hi:+.2f}]   ahead on {(per > 1e-9).sum()}, behind on {(per < -1e-9).sum()}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a_trials", type=Path)
    parser.add_argument("a_tuner")
    parser.add_argument("b_trials", type=Path)
    parser.add_argument("b_tuner")
    args = parser.parse_args()
    print(f"{args.a_tuner} ({args.a_trials.name}) against {args.b_tuner} ({args.b_trials.name}):")
    print("\n".join(paired(runs(args.a_trials, args.a_tuner), runs(args.b_trials, args.b_tuner))))


if __name__ == "__main__":
    main()

"""A development family where recompute is tuned layer by layer: the out-of-form development landscapes
with full recompute's method (uniform, block) and layer count (1, 2, 4, 8) tuned too, as the real
single-GPU tables tune them. The default families tune recompute as none / selective / full only, so
a rule about configurations that save a little memory next to an OOM (the guard's small-saving rule)
never meets the case it is about there.

To keep the spaces the default family's size, the loss fusion and the parameter-gather overlap (two
flags the model and the landscapes agree on) are fixed on. Development seeds only: nothing here reads
a test landscape.

    python benchmarks/dev_recompute_layers.py --tuners optico,model-greedy --seeds 8 --trials base.json
    python benchmarks/dev_recompute_layers.py --tuners optico --seeds 8 --small-saving 0 --trials off.json
    python benchmarks/paired_runs.py off.json optico base.json optico
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from optico import guard
from optico.bench.landscapes import SimDef, sim_defs
from optico.bench.suite import EFFECT_SIZE, landscape_seed, run_benchmark

PER_LAYER_RECOMPUTE = {"recompute_method": ["uniform", "block"], "recompute_num_layers": [1, 2, 4, 8]}
FIXED_ON = ("cross_entropy_loss_fusion", "overlap_param_gather")


def per_layer_family(skip: tuple[str, ...] = ("llama3-70b",)) -> list[SimDef]:
    """The development out-of-form family on every cluster, recompute tuned per layer."""
    out = []
    for d in sim_defs(landscape_seed(dev=True), all_clusters=True, effect_size=EFFECT_SIZE,
                      group="out-of-form", suffix="+oof-layers"):
        if d.preset in skip:
            continue
        tunables = {k: v for k, v in d.tunables.items() if k not in FIXED_ON} | PER_LAYER_RECOMPUTE
        fixed = d.fixed | {k: True for k in FIXED_ON}
        out.append(d.model_copy(update={"tunables": tunables, "fixed": fixed}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuners", default="optico")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--small-saving", type=float, default=None,
                        help="the guard's SMALL_SAVING for this run (0 turns the rule off)")
    parser.add_argument("--trials", type=Path, required=True)
    args = parser.parse_args()
    if args.small_saving is not None:
        guard.SMALL_SAVING = args.small_saving  # the forked workers inherit it
    defs = per_layer_family()
    t0 = time.perf_counter()
    doc = run_benchmark(defs, args.tuners.split(","), seeds=args.seeds, jobs=args.jobs, fidelity=False,
                        on_done=lambda r: print(r["name"], r.get("skipped") or r["landscape"]["configurations"],
                                                flush=True))
    args.trials.write_text(json.dumps(doc["runs"], indent=1, default=float) + "\n")
    print(f"{len(defs)} landscapes in {time.perf_counter() - t0:.0f} s; trials written to {args.trials}")


if __name__ == "__main__":
    main()

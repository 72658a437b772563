"""The tuner benchmark (`optico bench`): OptiCo against black-box search and the expert.

- `landscapes`: simulated landscapes with hidden constants and effects, replay landscapes
- `experts`: the expert baseline of a landscape (example specs, NVIDIA's recipes)
- `tuners`: the `Tuner` contract and the tuners (optico, random, grid, optuna, expert)
- `metrics`: per-run figures and their medians
- `suite`: which landscapes, running every tuner on them (in parallel)
- `report`: Markdown, JSON, the convergence plot
- `cli`: the `optico bench` command
"""

# Declared here, not in `suite`, so that `optico --help` and every other command start without
# importing the benchmark (the performance model, the landscapes, the store: most of a second).
DEFAULT_TUNERS: tuple[str, ...] = ("optico", "model-rank", "model-greedy", "random-fit", "tpe", "tpe-warm",
                                   "gp-warm", "random")

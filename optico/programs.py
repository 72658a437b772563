"""What torchrun runs for a trial, as the job spec states it: the program types.

Declared here, apart from the launchers that run them, so that the spec (and the pool that
stores specs) can name a program without importing the launchers: `optico.launchers.program`
turns these into command lines, `optico.launchers.megatron.bench` runs the megatron-core driver.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

# Placeholders the user's command may hold, filled per node.
PLACEHOLDERS = ("{run_dir}", "{node_rank}", "{nnodes}", "{nproc_per_node}", "{world_size}", "{trial_key}")


class StepLimits(BaseModel):
    """How long a run warms up and times its steps (also the spec's `program: {kind: megatron-core}`)."""

    model_config = ConfigDict(extra="forbid")

    warmup: NonNegativeInt = Field(2, description="Untimed steps first (allocation, compilation, hooks).")
    max_steps: PositiveInt = Field(20, description="Timed steps at most (after warm-up).")
    min_steps: PositiveInt = Field(3, description="Timed steps at least before stability may stop timing.")
    cv_target: float = Field(0.02, gt=0, description="Stop once the CV of the last cv_window step times is this or less.")
    cv_window: PositiveInt = Field(5, description="Steps the coefficient of variation is taken over.")
    max_time_s: float | None = Field(None, gt=0, description="Stop timing after this many timed seconds.")
    seed: int = Field(1234, description="Seed of weights and synthetic tokens.")


class MegatronCoreProgram(StepLimits):
    """OptiCo's megatron-core benchmark driver (synthetic tokens, warm-up then timed steps)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["megatron-core"] = "megatron-core"
    python: str | None = Field(None, description="Interpreter that runs torchrun; None = the launcher's own "
                                                 "(the Ray worker's on a cluster).")


class MegatronLMProgram(BaseModel):
    """The user's Megatron-LM command; the strategy's flags replace theirs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["megatron-lm"]
    command: list[str] = Field(min_length=1, description="The training script and its flags, without torchrun, "
                               "e.g. [pretrain_gpt.py, --num-layers, '32', ...]. May hold {run_dir}, {node_rank}, "
                               "{nnodes}, {nproc_per_node}, {world_size}, {trial_key}.")
    cwd: str | None = Field(None, description="Directory the command runs in (a Megatron-LM checkout); "
                                              "None = the trial's run directory.")
    train_iters: PositiveInt | None = Field(20, description="Iterations each trial runs (replaces "
                                                            "--train-iters); None = the command's own.")
    warmup_iters: NonNegativeInt = Field(3, description="Logged iterations not timed.")
    log_interval: PositiveInt | None = Field(1, description="Replaces --log-interval; None = the command's own.")
    skip_eval: bool = Field(True, description="Add --eval-iters 0 (no validation pass after the timed run).")
    drop_flags: list[str] = Field(default_factory=lambda: ["--save", "--load"],
                                  description="Flags removed from the command, with their values.")
    vpp_flag: Literal["stages", "layers"] = Field(
        "stages", description="VPP as --num-virtual-stages-per-pipeline-rank (stages) or, for Megatron-LM "
                              "before that flag, --num-layers-per-virtual-pipeline-stage (layers).")
    python: str | None = Field(None, description="Interpreter that runs torchrun; None = the launcher's own.")


ProgramSpec = Annotated[Union[MegatronCoreProgram, MegatronLMProgram], Field(discriminator="kind")]

"""What torchrun runs for a trial, and the command lines that run it on each node.

Two programs (the spec's `launcher.program`, typed in `optico.programs`):
- `megatron-core`: OptiCo's benchmark driver (`optico.launchers.megatron.bench`) with a spec
  file holding the workload, the strategy and the step limits;
- `megatron-lm`: the user's own training command (e.g. ``pretrain_gpt.py`` with their data
  and tokenizer flags), the strategy rendered as flags that replace theirs
  (`optico.launchers.megatron_lm`).

`prepare` turns (program, workload, strategy) into a `PreparedRun`: files to write into the
node's run directory and, per node, the torchrun command. Nothing here starts a process, so
the local launcher and each Ray node agent share it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from optico.launchers.megatron.bench import BenchSpec, torchrun_command, torchrun_prefix
from optico.programs import PLACEHOLDERS, MegatronCoreProgram, MegatronLMProgram, ProgramSpec, StepLimits
from optico.strategy import Strategy
from optico.workload import Workload

# The program types live in optico.programs (the spec names them without importing launchers);
# they are re-exported here for the launchers' callers.
__all__ = ["PLACEHOLDERS", "SPEC_FILE", "MegatronCoreProgram", "MegatronLMProgram", "PreparedRun", "ProgramSpec",
           "StepLimits", "node_layout", "prepare"]

SPEC_FILE = "bench-spec.json"


def node_layout(workload: Workload) -> tuple[int, int]:
    """(nodes, processes per node) for the workload's world size; ValueError when the world
    does not split evenly over the nodes it needs."""
    world, per_node = workload.world_size, workload.cluster.gpus_per_node
    nnodes = -(-world // per_node)
    if world % nnodes:
        raise ValueError(f"workload.cluster: {world} GPUs do not split evenly over {nnodes} nodes of "
                         f"{per_node} GPUs")
    return nnodes, world // nnodes


@dataclass
class PreparedRun:
    """One trial's program, ready to start on any node."""

    kind: str
    nnodes: int
    nproc_per_node: int
    files: dict[str, str] = field(default_factory=dict)  # name -> content, written into the run directory
    args: list[str] = field(default_factory=list)  # after torchrun's own options; may hold placeholders
    python: str | None = None
    cwd: str | None = None
    warmup_iters: int = 0

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def command(self, run_dir: str, *, node_rank: int = 0, master_addr: str | None = None,
                master_port: int | None = None, trial_key: str = "", python: str | None = None) -> list[str]:
        """torchrun's argv on node `node_rank`. Without `master_addr` (one node) torchrun's
        standalone rendezvous picks a free port itself."""
        exe = self.python or python or sys.executable
        if self.kind == "megatron-core":
            return torchrun_command(f"{run_dir}/{SPEC_FILE}", self.nproc_per_node, nnodes=self.nnodes,
                                    node_rank=node_rank, master_addr=master_addr, master_port=master_port,
                                    python=exe)
        cmd = torchrun_prefix(self.nproc_per_node, nnodes=self.nnodes, node_rank=node_rank,
                              master_addr=master_addr, master_port=master_port, python=exe)
        values = {"{run_dir}": run_dir, "{node_rank}": str(node_rank), "{nnodes}": str(self.nnodes),
                  "{nproc_per_node}": str(self.nproc_per_node), "{world_size}": str(self.world_size),
                  "{trial_key}": trial_key}
        args = []
        for arg in self.args:
            for key, value in values.items():
                arg = arg.replace(key, value)
            args.append(arg)
        return cmd + args


def prepare(program: MegatronCoreProgram | MegatronLMProgram | None, workload: Workload,
            strategy: Strategy) -> PreparedRun:
    """The run for `strategy`; ValueError for a program that cannot run this workload."""
    program = program or MegatronCoreProgram()
    nnodes, nproc = node_layout(workload)
    if isinstance(program, MegatronCoreProgram):
        limits = program.model_dump(include=set(StepLimits.model_fields))
        limits["min_steps"] = min(program.min_steps, program.max_steps)
        spec = BenchSpec(workload=workload, strategy=strategy, **limits)
        return PreparedRun(kind=program.kind, nnodes=nnodes, nproc_per_node=nproc,
                           files={SPEC_FILE: spec.model_dump_json(indent=2)}, python=program.python,
                           warmup_iters=program.warmup)
    from optico.launchers.megatron_lm import render_args

    args = render_args(program.command, workload, strategy, train_iters=program.train_iters,
                       log_interval=program.log_interval, skip_eval=program.skip_eval,
                       drop_flags=program.drop_flags, vpp_flag=program.vpp_flag)
    return PreparedRun(kind=program.kind, nnodes=nnodes, nproc_per_node=nproc, args=args, python=program.python,
                       cwd=program.cwd, warmup_iters=program.warmup_iters)

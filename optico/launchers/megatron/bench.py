"""OptiCo's megatron-core benchmark driver: trains a workload's model for a few steps with
one strategy and prints what it measured as one JSON line.

Usage (one process per GPU; on a machine without CUDA the same command runs on CPU over
gloo, for tiny models)::

    torchrun --nproc-per-node N -m optico.launchers.megatron.bench --spec-json spec.json
    torchrun --nproc-per-node N -m optico.launchers.megatron.bench \\
        --workload-json workload.json --strategy-json strategy.json [--warmup 2 --max-steps 20]
    python -m optico.launchers.megatron.bench --spec-json spec.json --check   # plan only, no run

The spec file holds ``{"workload": <Workload JSON>, "strategy": <Strategy JSON>, "warmup": 2,
"max_steps": 20, "min_steps": 3, "cv_target": 0.02, "cv_window": 5, "seed": 1234}`` (see
`BenchSpec`; a workload's ``model`` may be a preset name such as ``"tiny-gpt"``, a strategy
may use short names such as ``tp``). `write_spec` and `torchrun_command` build both for a
launcher. The world size torchrun starts must equal the workload's cluster size.

What runs: the workload's GPT/Llama decoder built with megatron-core (Transformer Engine
layers when TE imports, else megatron's local layers with attention through torch SDPA),
every Strategy field applied (TP, PP with uneven first/last stages, VPP, CP, EP, SP,
recompute, distributed optimizer and DDP overlaps, cross-entropy fusion, MoE dispatcher and
grouped GEMM), synthetic tokens, megatron-core's optimizer and forward-backward schedule,
global batch = workload.global_batch_size. After ``warmup`` steps it times steps until the
coefficient of variation of the last ``cv_window`` step times is at most ``cv_target`` (and at
least ``min_steps`` were timed) or ``max_steps`` timed steps have run (``max_time_s`` caps the
timed seconds).

Output (stdout; parse with `report.parse_output`):
- ``OPTICO_STEP {...}``: rank 0, one per step (step, phase, step_time_s, loss) — a heartbeat.
- ``OPTICO_RESULT {...}``: rank 0, once: ``ok``, ``step_time_s`` (mean of the stable window,
  max over ranks per step), ``step_time_median_s``, ``step_times_s``, ``steps`` (timed),
  ``warmup_steps``, ``skipped_steps`` (fp16 loss-scale overflows: run but never timed),
  ``stop_reason`` (stable | max_steps | max_time), ``stable``, ``cv``, ``cv_window``, ``cv_target``,
  ``tokens_per_s_per_gpu``, ``tflops_per_gpu`` (Megatron-LM's model FLOPs,
  `optico.perfmodel.flops`), ``mfu`` and ``peak_tflops`` (the workload's GPU and precision from
  `optico.gpus`; both null on CPU, where no peak applies), ``mem_max_allocated_gib`` and
  ``mem_max_reserved_gib`` (max over ranks; null on CPU), ``mem_avg_allocated_gib``,
  ``mem_limit_gib``, ``host_max_rss_gib``, ``gpu_util_avg``/``gpu_util_max`` (fractions, NVML;
  null without it), ``loss_first``/``loss_last``, ``losses``, ``loss_finite``, the layout
  (``world_size``, ``dp``, ``tp``, ``pp``, ``cp``, ``ep``, ``etp``, ``vpp``,
  ``micro_batch_size``, ``num_microbatches``, ``global_batch_size``, ``seq_length``,
  ``precision``, ``device``), ``model``, ``strategy`` (normalised), ``layer_spec``, ``effective`` (derived settings that ran),
  ``notes``, ``shim`` (CPU patches applied), ``fingerprint`` (python, torch, CUDA, NCCL,
  megatron-core, TE, GPU, driver...), ``init_s`` and ``wall_s``.
- ``OPTICO_ERROR {...}``: printed by each rank that caught an exception, then the process
  exits 1: ``category`` (oom | invalid_config | comm | unknown), ``message``,
  ``exception_type``, ``rank``, ``phase``, ``params`` (strategy fields at fault, when known),
  ``traceback_tail``.

Exit status: 0 with a result, 1 after an error line, 2 for a bad command line.
``OPTICO_BENCH_FAULT=KIND@RANK:STEP`` (KIND: oom, comm, invalid, unknown) makes that rank fail
after that step, for testing the failure path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import Field, NonNegativeInt, field_validator

from optico.launchers.megatron import report
from optico.programs import StepLimits
from optico.strategy import Strategy, strategy_from_mapping
from optico.workload import PRESETS, Workload

MODULE = "optico.launchers.megatron.bench"


class BenchSpec(StepLimits):
    """Everything one benchmark run needs."""

    workload: Workload
    strategy: Strategy = Strategy()
    max_skipped_steps: NonNegativeInt = Field(
        20, description="Optimizer steps skipped by fp16 loss scaling (never timed) before giving up.")
    lr: float = Field(1e-4, gt=0)
    use_cpu_initialization: bool | None = Field(
        None, description="Initialise weights on the host (TP-invariant); None = on CPU runs only.")
    check_rules: bool = Field(True, description="Refuse strategies optico.rules rejects before starting.")
    dist_timeout_s: float = Field(900, gt=0, description="Collective timeout of the process group.")

    @field_validator("workload", mode="before")
    @classmethod
    def _preset(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("model"), str):
            name = v["model"]
            if name not in PRESETS:
                raise ValueError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
            v = {**v, "model": PRESETS[name].model_dump()}
        return v

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return strategy_from_mapping(v)
        return v


def write_spec(path: str | os.PathLike, workload: Workload, strategy: Strategy, **options: Any) -> Path:
    """Writes a spec file for `torchrun_command`; `options` are BenchSpec's other fields."""
    spec = BenchSpec(workload=workload, strategy=strategy, **options)
    p = Path(path)
    p.write_text(spec.model_dump_json(indent=2))
    return p


def torchrun_command(spec_path: str | os.PathLike, nproc_per_node: int, *, nnodes: int = 1,
                     node_rank: int = 0, master_addr: str | None = None, master_port: int | None = None,
                     python: str | None = None) -> list[str]:
    """The torchrun argv that runs this driver on one node (standalone rendezvous on one node)."""
    return torchrun_prefix(nproc_per_node, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                           master_port=master_port, python=python) + ["-m", MODULE, "--spec-json", str(spec_path)]


def torchrun_prefix(nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0, master_addr: str | None = None,
                    master_port: int | None = None, python: str | None = None) -> list[str]:
    """torchrun and its own options for one node; the program and its arguments follow."""
    cmd = [python or sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and master_addr is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={master_addr}",
                f"--master-port={master_port or 29500}"]
    return cmd


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec-json", help="BenchSpec JSON file (workload, strategy, step limits).")
    p.add_argument("--workload-json", help="Workload JSON file (instead of --spec-json).")
    p.add_argument("--strategy-json", help="Strategy JSON file (with --workload-json; default: Megatron defaults).")
    for name, typ in (("warmup", int), ("max-steps", int), ("min-steps", int), ("cv-target", float),
                      ("cv-window", int), ("max-time-s", float), ("seed", int)):
        p.add_argument(f"--{name}", type=typ, default=None, help="Overrides the spec's value.")
    p.add_argument("--check", action="store_true", help="Validate and print the plan as JSON; run nothing.")
    return p


def load_spec(args: argparse.Namespace) -> BenchSpec:
    if args.spec_json:
        if args.workload_json or args.strategy_json:
            raise ValueError("give either --spec-json or --workload-json/--strategy-json, not both")
        data = json.loads(Path(args.spec_json).read_text())
    elif args.workload_json:
        data = {"workload": json.loads(Path(args.workload_json).read_text())}
        if args.strategy_json:
            data["strategy"] = json.loads(Path(args.strategy_json).read_text())
    else:
        raise ValueError("one of --spec-json or --workload-json is required")
    for key in ("warmup", "max_steps", "min_steps", "cv_target", "cv_window", "max_time_s", "seed"):
        value = getattr(args, key)
        if value is not None:
            data[key] = value
    return BenchSpec.model_validate(data)


# ---------------------------------------------------------------------------------------
# the run


class _Run:
    """State of one benchmark process. Megatron and torch are imported inside."""

    def __init__(self, spec: BenchSpec, rank: int, world: int, local_rank: int):
        self.spec, self.rank, self.world, self.local_rank = spec, rank, world, local_rank
        self.phase = "setup"
        self.params: list[str] = []

    # -- setup ---------------------------------------------------------------------------
    def setup(self) -> None:
        import time

        self.t_start = time.perf_counter()
        import torch

        from optico.launchers.megatron import cpu_shim

        self.shim = cpu_shim.install()  # before megatron is imported; no-op with CUDA
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda":
            torch.cuda.set_device(self.local_rank)
        from optico.launchers.megatron import compat, model as mdl

        self.compat, self.mdl = compat, mdl
        self.shim = self.shim + compat.apply_no_te_fixes() + compat.fuse_rope_without_te()
        w, s = self.spec.workload, self.spec.strategy
        self.phase = "validate"
        if self.spec.check_rules:
            from optico.rules import violations

            found = violations(w, s)
            if found:
                self.params = sorted({p for v in found for p in v.params})
                raise mdl.BenchConfigError("; ".join(v.message for v in found), self.params)
        self.plan = mdl.make_plan(w, s, self.world, device=self.device,
                                  use_cpu_initialization=self.spec.use_cpu_initialization)

    def init_distributed(self) -> None:
        import datetime
        import inspect
        import random

        import numpy as np
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator

        self.phase = "init_distributed"
        plan = self.plan
        timeout = datetime.timedelta(seconds=self.spec.dist_timeout_s)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.device == "cuda" else "gloo", timeout=timeout,
                                    rank=self.rank, world_size=self.world)
        # Per-step statistics travel on a host (gloo) group so they never queue behind, or
        # synchronise with, the training collectives on the GPU streams.
        self.stats_group = dist.new_group(backend="gloo", timeout=timeout) if self.device == "cuda" else None
        kw: dict[str, Any] = dict(
            tensor_model_parallel_size=plan.tp,
            pipeline_model_parallel_size=plan.pp,
            virtual_pipeline_model_parallel_size=plan.vpp if plan.vpp > 1 else None,
            context_parallel_size=plan.cp,
            expert_model_parallel_size=plan.ep,
            expert_tensor_parallel_size=plan.etp,
        )
        # Gloo groups only serve checkpointing of the distributed optimizer; skip them (the
        # keyword exists in 0.16 and 0.19, guarded anyway).
        if "create_gloo_process_groups" in inspect.signature(parallel_state.initialize_model_parallel).parameters:
            kw["create_gloo_process_groups"] = False
        parallel_state.initialize_model_parallel(**kw)
        # Megatron-LM's seeding: +100 per pipeline stage; TP/EP offsets come from the tracker.
        seed = self.spec.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
        random.seed(seed)
        np.random.seed(seed % (2 ** 32))
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        init_num_microbatches_calculator(rank=self.rank, rampup_batch_size=None,
                                         global_batch_size=plan.global_batch_size,
                                         micro_batch_size=plan.micro_batch_size, data_parallel_size=plan.dp)
        if self.spec.strategy.tp_comm_overlap:  # make_plan refused it without TE
            self.compat.init_tp_comm_overlap(seq_length=plan.seq_length, micro_batch_size=plan.micro_batch_size,
                                             context_parallel_size=plan.cp,
                                             hidden_size=self.spec.workload.model.hidden_size, tp=plan.tp,
                                             fp8=plan.precision == "fp8")

    def build(self) -> None:
        from megatron.core.distributed import finalize_model_grads

        self.phase = "build"
        mdl, w, s, plan = self.mdl, self.spec.workload, self.spec.strategy.normalized(), self.plan
        self.config = config = mdl.transformer_config(w, s, plan)
        chunks = mdl.model_chunks(w, config, plan)
        self.model = mdl.wrap(chunks, config, s, plan)
        self.optimizer = mdl.optimizer(self.model, config, s, lr=self.spec.lr)
        # Training hooks, as Megatron-LM's train() installs them.
        one = len(self.model) == 1
        config.grad_scale_func = self.optimizer.scale_loss
        if s.overlap_grad_reduce:
            no_sync = [m.no_sync for m in self.model]
            grad_sync = [m.start_grad_sync for m in self.model]  # align_grad_reduce (default on)
            config.no_sync_func = no_sync[0] if one else no_sync
            config.grad_sync_func = grad_sync[0] if one else grad_sync
        if s.overlap_param_gather and plan.vpp > 1:  # align_param_gather: interleaved schedule only
            param_sync = [m.start_param_sync for m in self.model]
            config.param_sync_func = param_sync[0] if one else param_sync
        config.finalize_model_grads_func = finalize_model_grads
        # Megatron-LM keeps the param-gather pre-hooks off until a step has succeeded.
        self.prehook_off = s.use_distributed_optimizer and s.overlap_param_gather
        self.saved_param_sync = None
        if self.prehook_off:
            for m in self.model:
                m.disable_forward_pre_hook(param_sync=False)
            self.saved_param_sync, config.param_sync_func = config.param_sync_func, None
        self.batches = self._batches()

    def _batches(self) -> list[dict[str, Any]]:
        """This rank's micro-batches of synthetic tokens. Sample i of the global batch is drawn
        from seed and i alone, so every layout sees the same global batch."""
        import torch
        from megatron.core import parallel_state

        plan, m = self.plan, self.spec.workload.model
        dp_rank = parallel_state.get_data_parallel_rank()
        seq, mbs = plan.seq_length, plan.micro_batch_size
        distinct = min(plan.num_microbatches, 64)  # cycled; content does not change speed
        gen = torch.Generator()
        device = torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")
        out = []
        for i in range(distinct):
            rows = []
            for j in range(mbs):
                sample = i * mbs * plan.dp + dp_rank * mbs + j
                gen.manual_seed(self.spec.seed * 1_000_003 + sample)
                rows.append(torch.randint(0, m.vocab_size, (seq + 1,), generator=gen, dtype=torch.int64))
            data = torch.stack(rows)
            batch = {
                "tokens": data[:, :-1].contiguous(),
                "labels": data[:, 1:].contiguous(),
                "loss_mask": torch.ones(mbs, seq, dtype=torch.float32),
                "position_ids": torch.arange(seq, dtype=torch.int64).unsqueeze(0).expand(mbs, seq).contiguous(),
            }
            if plan.cp > 1:
                batch = _slice_for_cp(batch, plan.cp, parallel_state.get_context_parallel_rank())
            out.append({k: v.to(device) for k, v in batch.items()})
        return out

    # -- training ------------------------------------------------------------------------
    def _iterators(self):
        import itertools

        its = [itertools.cycle(self.batches) for _ in self.model]
        return its if len(its) > 1 else its[0]

    def train(self) -> dict[str, Any]:
        import time
        from functools import partial

        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.phase = "train"
        spec, plan, cuda = self.spec, self.plan, self.device == "cuda"
        fb = get_forward_backward_func()
        data = self._iterators()
        report_loss = parallel_state.is_pipeline_last_stage(ignore_virtual=True) and \
            parallel_state.get_tensor_model_parallel_rank() == 0

        def loss_func(loss_mask, output_tensor):
            losses = output_tensor.float().reshape(-1)
            mask = loss_mask.reshape(-1).float()
            loss_sum = torch.sum(losses * mask)
            num_tokens = mask.sum().to(torch.int)
            # A copy: the schedule divides loss_sum in place.
            reported = torch.stack([loss_sum.detach().clone(), num_tokens.detach().float()])
            return loss_sum, num_tokens, {"lm loss": reported}

        def forward_step(data_iterator, model):
            batch = next(data_iterator)
            output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
            return output, partial(loss_func, batch["loss_mask"])

        from optico.launchers.megatron.report import Stopper, UtilSampler, emit

        stopper = Stopper(min_steps=spec.min_steps, max_steps=spec.max_steps, cv_target=spec.cv_target,
                          window=spec.cv_window, max_time_s=spec.max_time_s)
        sampler = UtilSampler()
        if cuda:
            sampler.open(torch.cuda.current_device())
        losses: list[float | None] = []
        step, skipped, sampling = 0, 0, False
        self.t_ready = time.perf_counter()
        def one_step() -> tuple[float, bool, float | None]:
            """One optimizer step over the global batch: (slowest rank's seconds, update applied, loss)."""
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for m in self.model:
                m.zero_grad_buffer()
            self.optimizer.zero_grad()
            reduced = fb(forward_step_func=forward_step, data_iterator=data, model=self.model,
                         num_microbatches=plan.num_microbatches, seq_length=plan.seq_length,
                         micro_batch_size=plan.micro_batch_size, decoder_seq_length=None, forward_only=False)
            ok, grad_norm, _ = self.optimizer.step()
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            # loss of this step (last stage, TP rank 0 report; summed over DP/CP) and the step
            # time as the slowest rank saw it, over the host group.
            local = torch.zeros(2, dtype=torch.float64)
            if report_loss and reduced:
                local += torch.stack([r["lm loss"] for r in reduced]).sum(0).double().cpu()
            stats = torch.tensor([dt], dtype=torch.float64)
            dist.all_reduce(local, group=self.stats_group)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=self.stats_group)
            loss = float(local[0] / local[1]) if local[1] > 0 else None
            self.last_grad_norm = None if grad_norm is None else float(grad_norm)
            return float(stats[0]), bool(ok), loss

        while True:
            timed = step >= spec.warmup
            if timed and not sampling:
                sampler.start()
                sampling = True
            dt, ok, loss = one_step()
            losses.append(loss)
            if self.prehook_off and ok:
                for m in self.model:
                    m.enable_forward_pre_hook()
                self.config.param_sync_func, self.prehook_off = self.saved_param_sync, False
            if self.rank == 0:
                emit(report.STEP_PREFIX, {"step": step + 1, "phase": "timed" if timed else "warmup",
                                          "step_time_s": round(dt, 6), "loss": loss,
                                          "grad_norm": self.last_grad_norm, "update_ok": ok})
            _maybe_inject_fault(self.rank, step)
            step += 1
            if not ok:  # fp16 overflow: the optimizer skipped the update; not a representative step
                skipped += 1
                if skipped > spec.max_skipped_steps:
                    raise RuntimeError(f"{skipped} optimizer steps skipped (fp16 loss-scale overflow): "
                                       f"the loss scale did not settle")
                continue
            if timed and stopper.add(dt):
                break
        util_avg, util_max = sampler.stop()
        profile_path = os.environ.get(PROFILE_ENV)
        if profile_path:
            from optico.launchers.megatron.profile import profile_steps

            profile_steps(one_step, PROFILE_STEPS, profile_path if self.rank == 0 else None, cuda=cuda)
        return {"stopper": stopper, "losses": losses, "util": (util_avg, util_max), "skipped": skipped}

    # -- result ----------------------------------------------------------------------------
    def result(self, trained: dict[str, Any]) -> dict[str, Any] | None:
        import math
        import resource
        import statistics
        import time

        import torch
        import torch.distributed as dist

        from optico.flops import flops_per_iteration

        self.phase = "report"
        plan, w, cuda = self.plan, self.spec.workload, self.device == "cuda"
        gib = float(1 << 30)
        mem = torch.zeros(4, dtype=torch.float64)  # max alloc, max reserved, limit, rss
        if cuda:
            mem[0] = torch.cuda.max_memory_allocated() / gib
            mem[1] = torch.cuda.max_memory_reserved() / gib
            mem[2] = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / gib
        mem[3] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / gib
        mem_max = mem.clone()
        dist.all_reduce(mem_max, op=dist.ReduceOp.MAX, group=self.stats_group)
        mem_sum = mem.clone()
        dist.all_reduce(mem_sum, group=self.stats_group)
        u_avg, u_max = trained["util"]
        util = torch.tensor([u_avg if u_avg is not None else -1.0, u_max if u_max is not None else -1.0,
                             1.0 if u_avg is not None else 0.0], dtype=torch.float64)
        util_sum = util.clone()
        dist.all_reduce(util_sum, group=self.stats_group)
        util_max = util.clone()
        dist.all_reduce(util_max, op=dist.ReduceOp.MAX, group=self.stats_group)
        if self.rank != 0:
            return None
        stopper = trained["stopper"]
        window = stopper.window_times()
        step_time = statistics.fmean(window)
        tokens = plan.global_batch_size * plan.seq_length
        tflops = flops_per_iteration(w, plan.tp) / (step_time * 1e12 * plan.world_size)
        peak = w.peak_tflops if cuda else None
        losses = trained["losses"]
        finite = [x for x in losses if x is not None]
        have_util = util_sum[2] >= self.world - 0.5
        c = stopper.current_cv()
        return {
            "ok": True,
            "step_time_s": step_time,
            "step_time_median_s": statistics.median(window),
            "step_times_s": [round(t, 6) for t in stopper.times],
            "steps": len(stopper.times),
            "warmup_steps": self.spec.warmup,
            "skipped_steps": trained["skipped"],
            "stop_reason": stopper.reason,
            "stable": c is not None and c <= self.spec.cv_target,
            "cv": c,
            "cv_window": len(window),
            "cv_target": self.spec.cv_target,
            "tokens_per_s_per_gpu": tokens / step_time / plan.world_size,
            "tflops_per_gpu": tflops,
            "mfu": tflops / peak if peak else None,
            "peak_tflops": peak,
            "mem_max_allocated_gib": float(mem_max[0]) if cuda else None,
            "mem_max_reserved_gib": float(mem_max[1]) if cuda else None,
            "mem_avg_allocated_gib": float(mem_sum[0] / self.world) if cuda else None,
            "mem_limit_gib": float(mem_max[2]) if cuda else None,
            "host_max_rss_gib": float(mem_max[3]),
            "gpu_util_avg": float(util_sum[0] / self.world) if have_util else None,
            "gpu_util_max": float(util_max[1]) if have_util else None,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "losses": losses,
            "loss_finite": bool(finite) and len(finite) == len(losses) and all(math.isfinite(x) for x in finite),
            "world_size": plan.world_size, "dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "cp": plan.cp,
            "ep": plan.ep, "etp": plan.etp, "vpp": plan.vpp,
            "micro_batch_size": plan.micro_batch_size, "num_microbatches": plan.num_microbatches,
            "global_batch_size": plan.global_batch_size, "seq_length": plan.seq_length,
            "precision": plan.precision, "device": self.device,
            "model": w.model.name,
            "strategy": self.spec.strategy.normalized().model_dump(mode="json"),
            "layer_spec": plan.layer_spec,
            "effective": plan.effective,
            "notes": plan.notes,
            "shim": self.shim,
            "fingerprint": self.compat.fingerprint(),
            "init_s": self.t_ready - self.t_start,
            "wall_s": time.perf_counter() - self.t_start,
        }

    def close(self) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state

        self.phase = "teardown"
        if dist.is_initialized():
            dist.barrier(group=self.stats_group)
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


FAULT_ENV = "OPTICO_BENCH_FAULT"
# OPTICO_BENCH_PROFILE=FILE: after timing, profile a few more steps and write where the time went.
PROFILE_ENV = "OPTICO_BENCH_PROFILE"
PROFILE_STEPS = 3


def _maybe_inject_fault(rank: int, step: int) -> None:
    """Test hook: ``OPTICO_BENCH_FAULT=KIND@RANK:STEP`` raises on that rank after that step
    (0-based) as the real failure would: KIND is oom, comm, invalid or unknown."""
    value = os.environ.get(FAULT_ENV)
    if not value:
        return
    kind, _, where = value.partition("@")
    r, _, st = where.partition(":")
    if int(r or 0) != rank or int(st or 0) != step:
        return
    import torch

    if kind == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by " + FAULT_ENV + ")")
    if kind == "comm":
        raise torch.distributed.DistBackendError("NCCL error: remote process exited (injected by " + FAULT_ENV + ")")
    if kind == "invalid":
        raise AssertionError("injected configuration check failure (" + FAULT_ENV + ")")
    raise RuntimeError("injected failure (" + FAULT_ENV + ")")


def _slice_for_cp(batch: dict[str, Any], cp: int, cp_rank: int) -> dict[str, Any]:
    """Context parallel's load-balanced split: the sequence in 2·CP chunks, rank r keeps
    chunks r and 2·CP-1-r (causal attention work then balances across ranks)."""
    import torch

    out = {}
    for k, v in batch.items():
        chunks = v.view(v.shape[0], 2 * cp, v.shape[1] // (2 * cp))
        idx = torch.tensor([cp_rank, 2 * cp - 1 - cp_rank])
        out[k] = chunks.index_select(1, idx).reshape(v.shape[0], -1).contiguous()
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    # Megatron-LM's launch scripts: one CUDA work queue so TP/SP communication overlaps in
    # issue order. Must be set before CUDA initialises; a launcher may override it.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "WORLD_SIZE" not in os.environ:  # plain `python -m ...`: a one-process group on this host
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    args = _parser().parse_args(argv)
    run: _Run | None = None
    try:
        spec = load_spec(args)
        run = _Run(spec, rank, world, local_rank)
        run.setup()
        if args.check:
            plan = run.plan
            print(json.dumps({"ok": True, "plan": {k: v for k, v in vars(plan).items()},
                              "strategy": spec.strategy.normalized().model_dump(mode="json")}, default=str))
            return 0
        run.init_distributed()
        run.build()
        trained = run.train()
        result = run.result(trained)
        if result is not None:
            report.emit(report.RESULT_PREFIX, result)
        run.close()
        return 0
    except Exception as exc:  # every failure becomes one structured line, never a silent exit
        phase = run.phase if run is not None else "spec"
        params = list(getattr(exc, "params", None) or (run.params if run is not None else []))
        report.emit(report.ERROR_PREFIX, report.error_payload(exc, rank=rank, phase=phase, params=params))
        sys.stderr.flush()
        # Other ranks may be blocked in a collective with this one: leave now, without
        # running the process-group destructors that could wait on them.
        os._exit(1)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is torn down already; skip the interpreter's ~1 s of module finalisation.
    os._exit(code)

"""CPU shim: lets megatron-core's real training path run on a machine without CUDA.

megatron-core assumes a GPU in many small places (tensors created with ``device="cuda"``,
``torch.cuda.current_device()``, CUDA streams and events, the CUDA RNG tracker, type checks
against ``'torch.cuda.FloatTensor'``). None of that changes *what* the code does on CPU, so
the shim replaces those entry points with CPU equivalents and the real code runs unchanged:
model parallel state, TP/SP layers, the pipeline schedules (1F1B, interleaved), DDP with grad
buckets, the distributed optimizer, recompute and the MoE dispatchers, over the gloo backend.

Rules:
- Everything here is a workaround for the absence of CUDA and nothing else; `install()` does
  nothing when ``torch.cuda.is_available()``. GPU runs never see these patches.
- Each patch says what it replaces. Patches are process-wide: the benchmark process is the
  only thing running in this interpreter.
- Configuration choices that CPU forces (expert TP 1, no pseudo-deallocation of pipeline
  outputs) live in `config_overrides` / `plan_overrides`, also here, so one module holds
  every CPU decision.

Workarounds that are about a missing Transformer Engine rather than a missing GPU (an
SP-capable norm, SDPA attention, ``te_general_gemm`` in 0.16.1) live in `layers` and `compat`
because the GPU box without TE needs them too.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import logging
import sys
import types
from typing import Any

import torch

_active = False
# Names of the patches applied, in order: reported with each result.
APPLIED: list[str] = []


def needed() -> bool:
    """True when this process has no CUDA device, so the shim must be installed."""
    return not torch.cuda.is_available()


def active() -> bool:
    return _active


# ---------------------------------------------------------------------------------------
# device mapping


def _cpu_device(dev: Any) -> Any:
    """Maps a CUDA device designation ('cuda', 'cuda:1', 0, torch.device('cuda')) to CPU."""
    if dev is None:
        return None
    if isinstance(dev, bool):
        return dev
    if isinstance(dev, int):  # a bare int is a CUDA ordinal in torch's factory functions
        return torch.device("cpu")
    if isinstance(dev, str):
        return torch.device("cpu") if dev.startswith("cuda") else dev
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cpu")
    return dev


def _is_device_like(arg: Any) -> bool:
    return (isinstance(arg, int) and not isinstance(arg, bool)) or (
        isinstance(arg, str) and arg.split(":")[0] in ("cuda", "cpu", "meta")
    ) or isinstance(arg, torch.device)


# Factory functions that take device= (megatron passes device="cuda" or
# torch.cuda.current_device() to them in buffers, optimizers, schedules and TP mappings).
_FACTORIES = (
    "empty", "zeros", "ones", "full", "tensor", "as_tensor", "arange", "linspace", "eye",
    "rand", "randn", "randint", "randperm", "empty_strided",
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
)


def _wrap_factory(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # pinned host memory needs a CUDA context
        return fn(*args, **kwargs)

    factory.__optico_shim__ = True
    return factory


def _patch_factories() -> None:
    # Replaces: torch.empty(..., device="cuda") and friends (param_and_grad_buffer,
    # distrib_optimizer, clip_grads, grad_scaler, schedules' total_num_tokens, TP mappings).
    # A TorchFunctionMode would not reach code run by autograd's backward; module attributes do.
    for name in _FACTORIES:
        fn = getattr(torch, name, None)
        if fn is not None and not getattr(fn, "__optico_shim__", False):
            setattr(torch, name, _wrap_factory(fn))
    APPLIED.append("factories: device='cuda'/ordinal -> cpu, pin_memory -> False")


def _to_cpu(orig_to):
    """`.to` (Tensor's or Module's: they take the same arguments) with any device given moved to the CPU."""

    @functools.wraps(orig_to)
    def to(self, *args, **kwargs):
        if args and _is_device_like(args[0]):
            args = (_cpu_device(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return orig_to(self, *args, **kwargs)

    return to


def _patch_tensor_methods() -> None:
    T = torch.Tensor
    orig_type = T.type

    # Replaces: tensor.cuda() / tensor.cuda(torch.cuda.current_device()) -> the tensor itself.
    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self

    # Replaces: the optimizers' `param.type() == 'torch.cuda.FloatTensor'` checks (optimizer.py,
    # distrib_optimizer.py, clip_grads.py): CPU tensors answer with the CUDA type name, and a
    # CUDA type name given as target maps to the CPU type.
    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None:
            name = orig_type(self)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if isinstance(dtype, str):
            dtype = dtype.replace("torch.cuda.", "torch.")
        return orig_type(self, dtype, non_blocking, **kwargs)

    # Replaces: pinned host buffers (optimizer offload, MoE) -> plain host memory.
    def pin_memory(self, *args, **kwargs):
        return self

    def _new(method_name):
        orig = getattr(T, method_name)

        # Replaces: tensor.new_empty(..., device=torch.cuda.current_device()).
        @functools.wraps(orig)
        def new(self, *args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _cpu_device(kwargs["device"])
            return orig(self, *args, **kwargs)

        return new

    T.cuda = cuda
    T.to = _to_cpu(T.to)  # tensor.to("cuda") / tensor.to(device=torch.cuda.current_device())
    T.type = type_
    T.pin_memory = pin_memory
    for m in ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"):
        setattr(T, m, _new(m))
    APPLIED.append("Tensor.cuda/.to/.new_*/.pin_memory -> cpu; Tensor.type() reports torch.cuda.* names")


def _patch_module_methods() -> None:
    M = torch.nn.Module

    # Replaces: model_chunk.cuda(torch.cuda.current_device()) -> no-op.
    def cuda(self, device=None):
        return self

    M.cuda = cuda
    M.to = _to_cpu(M.to)  # module.to("cuda") / module.to(device=...)
    APPLIED.append("Module.cuda/.to -> cpu")


# ---------------------------------------------------------------------------------------
# CUDA runtime: devices, streams, events, memory, NVTX


class _Stream:
    """Stands in for torch.cuda.Stream: work on CPU is synchronous, so every wait is a no-op."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event if event is not None else _Event()

    def synchronize(self):
        pass

    def query(self):
        return True

    def __eq__(self, other):
        return isinstance(other, _Stream)

    def __hash__(self):
        return 0


class _Event:
    """Stands in for torch.cuda.Event: records wall-clock time so elapsed_time still works."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **kwargs):
        self._t = None

    def record(self, stream=None):
        import time

        self._t = time.perf_counter()

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        return 1000.0 * ((end._t or 0.0) - (self._t or 0.0))


_DEFAULT_STREAM = _Stream()


def _patch_cuda_runtime() -> None:
    cuda = torch.cuda
    # Replaces: torch.cuda.current_device() (device= arguments, .cuda(ordinal)): ordinal 0,
    # which the factory patch maps to cpu.
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device: None
    # Replaces: torch.cuda.synchronize / empty_cache / peak-memory bookkeeping -> no-ops.
    for name in ("synchronize", "empty_cache", "ipc_collect", "reset_peak_memory_stats",
                 "reset_max_memory_allocated", "reset_accumulated_memory_stats"):
        setattr(cuda, name, lambda *a, **k: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, name, lambda *a, **k: 0)
    # Replaces: torch.cuda.Stream / Event / stream() / current_stream() / default_stream()
    # (DDP communication stream, param_and_grad_buffer waits, pipeline utils).
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.current_stream = lambda device=None: _DEFAULT_STREAM
    cuda.default_stream = lambda device=None: _DEFAULT_STREAM
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.device = lambda device=None: contextlib.nullcontext()
    # Replaces: NVTX ranges (schedules, pipeline utils) -> no-ops.
    for name in ("range_push", "range_pop", "mark"):
        setattr(cuda.nvtx, name, lambda *a, **k: None)
    cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()
    APPLIED.append("torch.cuda current_device/streams/events/synchronize/memory/nvtx -> cpu stand-ins")


# ---------------------------------------------------------------------------------------
# RNG


def _patch_cuda_rng() -> None:
    # Replaces: the CUDA generator used by megatron's RNG tracker and
    # model_parallel_cuda_manual_seed -> the CPU default generator. The tracker forks it per
    # named state and restores it on exit, which keeps its semantics on one generator.
    cuda = torch.cuda

    def manual_seed(seed):  # not torch.manual_seed: that one calls torch.cuda.manual_seed_all
        torch.default_generator.manual_seed(int(seed))

    cuda.manual_seed = manual_seed
    cuda.manual_seed_all = manual_seed
    cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    cuda.set_rng_state = lambda new_state, device="cuda": torch.set_rng_state(new_state)
    cuda.random.manual_seed = cuda.manual_seed
    cuda.random.manual_seed_all = cuda.manual_seed_all
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.random.set_rng_state = cuda.set_rng_state
    APPLIED.append("torch.cuda RNG -> CPU generator")


def _patch_megatron_rng() -> None:
    # Replaces: megatron.core.tensor_parallel.random._get_cuda_rng_state / _set_cuda_rng_state,
    # which go through torch.cuda.default_generators and torch.cuda._lazy_call (the latter
    # silently never runs without CUDA), used by CudaRNGStatesTracker.add/fork.
    from megatron.core.tensor_parallel import random as mrandom

    def get_state(device="cuda", clone=False, graph_safe=False):
        return torch.get_rng_state()

    def set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    if hasattr(mrandom, "_get_cuda_rng_state"):
        mrandom._get_cuda_rng_state = get_state
    if hasattr(mrandom, "_set_cuda_rng_state"):
        mrandom._set_cuda_rng_state = set_state
    # The tracker warns when the CPU state moves inside a fork; on one generator it always
    # does (the fork *is* the CPU generator here), so that warning carries no information.
    logging.getLogger(mrandom.__name__).setLevel(logging.ERROR)
    APPLIED.append("megatron RNG tracker state get/set -> CPU generator")


# ---------------------------------------------------------------------------------------
# collectives


def _patch_collectives() -> None:
    import torch.distributed as dist

    orig = dist.all_to_all_single

    # Replaces: MoE alltoall dispatcher split sizes, which stay tensors when there is no
    # CUDA sync to turn them into lists; gloo wants lists of ints.
    @functools.wraps(orig)
    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        if isinstance(output_split_sizes, torch.Tensor):
            output_split_sizes = output_split_sizes.tolist()
        if isinstance(input_split_sizes, torch.Tensor):
            input_split_sizes = input_split_sizes.tolist()
        return orig(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

    dist.all_to_all_single = all_to_all_single
    APPLIED.append("all_to_all_single split sizes tensor -> list (gloo)")


# ---------------------------------------------------------------------------------------
# imports


def _stub_triton_paged_stash() -> None:
    # Replaces: megatron.core.transformer.moe.ops.paged_stash (0.17+), imported by
    # `import megatron.core` and made only of Triton kernels; Triton ships with CUDA builds of
    # torch, not with the CPU build. The stub exposes the names and refuses to be used.
    if importlib.util.find_spec("triton") is not None:
        return
    try:
        from packaging.version import Version

        if Version(importlib.metadata.version("megatron-core")) < Version("0.17"):
            return
    except Exception:  # unknown version: stub anyway, it is inert unless MoE paged stash is used
        pass
    name = "megatron.core.transformer.moe.ops.paged_stash"
    if name in sys.modules:
        return
    stub = types.ModuleType(name)
    stub.__doc__ = "OptiCo CPU stub: the paged-stash Triton kernels need CUDA."

    def _unavailable(*args, **kwargs):
        raise RuntimeError("MoE paged stash needs Triton and CUDA")

    stub.GLOBAL_BLOCK_SIZE = 1024
    stub.paged_stash_copy_kernel = _unavailable
    stub.paged_stash_pop_kernel = _unavailable
    stub.__all__ = ["GLOBAL_BLOCK_SIZE", "paged_stash_copy_kernel", "paged_stash_pop_kernel"]
    sys.modules[name] = stub
    APPLIED.append("stub moe.ops.paged_stash (Triton kernels, megatron-core >= 0.17)")


# ---------------------------------------------------------------------------------------
# compilation


def _patch_compile() -> None:
    # Replaces: torch.compile, which megatron.core.jit.jit_fuser is bound to at import (fused
    # bias-SwiGLU/GeLU, bias-dropout-add, cross-entropy pieces...). On CPU, Inductor's C++
    # build takes tens of seconds per function for a run of a few steps; the undecorated
    # functions compute the same thing, so the fused code paths still run, eagerly.
    def compile(model=None, **kwargs):
        return model if model is not None else (lambda fn: fn)

    torch.compile = compile
    APPLIED.append("torch.compile -> identity (megatron jit_fuser runs eagerly)")


# ---------------------------------------------------------------------------------------
# configuration decided by the absence of CUDA


def config_overrides(kw: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """CPU-only changes to the TransformerConfig keyword arguments; appends a note for each
    change that differs from what a GPU run would use."""
    if not _active:
        return kw
    kw = dict(kw)
    # Megatron frees a stage's output right after handing it to isend (pseudo-deallocation);
    # NCCL has read it by then in stream order, gloo sends asynchronously from the freed
    # buffer, so the interleaved schedule's overlapped sends carried garbage (NaN by step 4).
    if kw.get("deallocate_pipeline_outputs"):
        kw["deallocate_pipeline_outputs"] = False
        if (kw.get("pipeline_model_parallel_size") or 1) > 1:
            notes.append("deallocate_pipeline_outputs off on CPU (gloo's asynchronous sends read the buffer later)")
    return kw


def plan_overrides(plan: Any) -> None:
    """CPU-only changes to the run layout (`model.Plan`), with a note for each."""
    if not _active:
        return
    # Expert tensor parallelism > 1 all-gathers uneven shards, which gloo cannot do.
    if plan.etp > 1:
        plan.notes.append(f"expert_tensor_parallel_size {plan.etp} -> 1 on CPU "
                          f"(gloo cannot all-gather the uneven expert shards)")
        plan.etp = 1


def install() -> list[str]:
    """Installs every patch when there is no CUDA; returns what was applied (empty on GPU).

    Call before importing megatron.core."""
    global _active
    if _active or not needed():
        return list(APPLIED)
    _stub_triton_paged_stash()
    _patch_factories()
    _patch_tensor_methods()
    _patch_module_methods()
    _patch_cuda_runtime()
    _patch_cuda_rng()
    _patch_collectives()
    _patch_compile()
    _patch_megatron_rng()
    _active = True
    return list(APPLIED)

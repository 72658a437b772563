"""What this process's software stack can do, and the small guards between megatron-core
versions (0.16.1 on Python 3.11; 0.17+ need Python 3.12; the GPU image carries 0.19.x).

Import after `cpu_shim.install()`: importing megatron.core here is the first import.

Version differences the benchmark meets (checked against the core_v0.16.1 and core_v0.19.0
sources):
- Layer specs: 0.16 builds MLPs as ModuleSpec and has ``moe_use_legacy_grouped_gemm`` (legacy
  GroupedMLP, needs the ``grouped_gemm`` package); 0.19 builds them as partials, dropped the
  legacy GroupedMLP (no TE means SequentialMLP) and the config field. Both accept
  ``get_gpt_layer_{local,with_transformer_engine}_spec(num_experts=, moe_grouped_gemm=)`` and
  call norms as ``cls(config=, hidden_size=, eps=)``, which is all the benchmark passes.
- ``moe_utils.te_general_gemm`` is left undefined by 0.16.1 when TE is absent (the router
  then raises NameError); 0.19 sets it to None. `apply_no_te_fixes` sets it.
- ``init_num_microbatches_calculator`` gained keyword defaults and new arguments in 0.19;
  the benchmark passes the 0.16 arguments by keyword.
- TransformerConfig gained/lost fields (e.g. 0.19 drops ``moe_use_legacy_grouped_gemm``):
  `config_kwargs_supported` drops keywords the installed dataclass does not know, so one
  config builder serves both.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
from typing import Any

import torch

from packaging.version import Version


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def mcore_version() -> Version:
    from megatron.core import package_info

    return Version(package_info.__version__)


def _have_te() -> bool:
    """Transformer Engine usable: importable, and megatron's TE extension imports (it needs CUDA)."""
    if not torch.cuda.is_available() or importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        importlib.import_module("transformer_engine.pytorch")
        importlib.import_module("megatron.core.extensions.transformer_engine")
    except Exception:  # a broken TE install is no TE
        return False
    return True


HAVE_TE: bool = _have_te()


def have_legacy_grouped_gemm() -> bool:
    """0.16's GroupedMLP without TE needs the `grouped_gemm` package; 0.17+ removed it."""
    return mcore_version() < Version("0.17") and importlib.util.find_spec("grouped_gemm") is not None


def have_apex_grad_accum_fusion() -> bool:
    """Megatron-LM turns gradient_accumulation_fusion off when apex's CUDA extension is missing."""
    return torch.cuda.is_available() and importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None


def apply_no_te_fixes() -> list[str]:
    """Fixes for running megatron-core without Transformer Engine (any device)."""
    applied = []
    if HAVE_TE:
        return applied
    from megatron.core.transformer.moe import moe_utils

    # 0.16.1: `te_general_gemm` is imported only inside the TE try-block, so the router's
    # `if te_general_gemm is not None` raises NameError without TE (0.19 sets None).
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        applied.append("moe_utils.te_general_gemm = None (megatron-core 0.16.1 without TE)")
    return applied


FUSE_ROPE_ENV = "OPTICO_BENCH_FUSE_ROPE"


def fuse_rope_without_te() -> list[str]:
    """Compiles megatron-core's unfused RoPE with torch.compile (CUDA, no TE, opt-in).

    Megatron's `apply_rope_fusion` needs Transformer Engine; without it RoPE runs as separate
    cos, sin, chunk, neg, cat, mul and add kernels for q and k of every layer — on an H100 about
    a tenth of a 1B model's step (benchmarks/gpu_profile.py). torch.compile turns the same
    function into one fused kernel forward and one backward, as megatron's own `jit_fuser`
    does for SwiGLU. Opt-in (OPTICO_BENCH_FUSE_ROPE=1) so earlier measurements stay comparable."""
    import os

    import torch

    if HAVE_TE or not torch.cuda.is_available() or os.environ.get(FUSE_ROPE_ENV) != "1":
        return []
    from megatron.core.models.common.embeddings import rope_utils

    rope_utils._apply_rotary_pos_emb_bshd = torch.compile(rope_utils._apply_rotary_pos_emb_bshd, dynamic=False)
    return ["rope_utils._apply_rotary_pos_emb_bshd compiled with torch.compile (no TE fused RoPE)"]


def init_tp_comm_overlap(*, seq_length: int, micro_batch_size: int, context_parallel_size: int,
                         hidden_size: int, tp: int, fp8: bool) -> None:
    """Transformer Engine's userbuffers for TP communication/GEMM overlap, as Megatron-LM
    sets them up before building the model (default configs, NCCL bootstrap). The TE API
    changed at 1.9 (bootstrap backend) and 2.7 (quantization modes)."""
    from packaging.version import Version
    from transformer_engine.pytorch import module as te_module

    te = Version(_version("transformer_engine") or _version("transformer-engine") or "0")
    shape = [seq_length * micro_batch_size // context_parallel_size, hidden_size]
    if te >= Version("2.7"):
        mode = te_module.base.UserBufferQuantizationMode
        te_module.base.initialize_ub(shape=shape, tp_size=tp, ub_cfgs={}, bootstrap_backend="nccl",
                                     quantization_modes=[mode.FP8 if fp8 else mode.NONE])
    elif te >= Version("1.9"):
        te_module.base.initialize_ub(shape=shape, tp_size=tp, use_fp8=fp8, ub_cfgs={}, bootstrap_backend="nccl")
    else:
        te_module.base.initialize_ub(shape=shape, tp_size=tp, use_fp8=fp8, ub_cfgs={})


def config_kwargs_supported(cls: type, kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Keeps the keywords the installed dataclass `cls` has; returns them and the dropped names."""
    names = {f.name for f in dataclasses.fields(cls)}
    kept = {k: v for k, v in kwargs.items() if k in names}
    return kept, sorted(set(kwargs) - names)


def fingerprint() -> dict[str, Any]:
    """Versions of everything that shapes a measurement."""
    import platform
    import socket

    fp: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "megatron_core": str(mcore_version()),
        "transformer_engine": _version("transformer_engine") or _version("transformer-engine"),
        "apex": _version("apex"),
        "gpu": None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "driver": None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
    }
    try:
        from optico import __version__ as optico_version

        fp["optico"] = optico_version
    except Exception:
        pass
    if torch.cuda.is_available():
        fp["gpu"] = torch.cuda.get_device_name()
        try:
            v = torch.cuda.nccl.version()
            fp["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        try:
            import pynvml

            pynvml.nvmlInit()
            d = pynvml.nvmlSystemGetDriverVersion()
            fp["driver"] = d.decode() if isinstance(d, bytes) else d
        except Exception:
            pass
    return fp

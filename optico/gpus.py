"""GPU catalog: memory, dense peak throughput per precision, bandwidths.

Peaks are the vendors' dense (no sparsity) figures. Bandwidths are per GPU and
one direction: `nvlink_gbps` inside a node, `network_gbps` between nodes (the
NIC share of one GPU). They feed the performance model and MFU.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["bf16", "fp16", "fp8"]


class GpuSpec(BaseModel):
    """One accelerator model."""

    model_config = ConfigDict(frozen=True)

    name: str
    arch: str = Field(description="Generation: volta, ampere, hopper, blackwell — efficiencies differ by it.")
    memory_gib: float = Field(description="Device memory the framework can use, GiB.")
    peak_tflops: dict[str, float] = Field(description="Dense peak TFLOP/s per precision.")
    hbm_gbps: float = Field(description="Memory bandwidth, GB/s.")
    nvlink_gbps: float = Field(description="Intra-node bandwidth per GPU per direction, GB/s.")
    network_gbps: float = Field(description="Inter-node bandwidth per GPU per direction, GB/s.")

    def peak(self, precision: str) -> float:
        """Dense peak TFLOP/s for `precision`; fp8 falls back to bf16 where the GPU has none."""
        if precision in self.peak_tflops:
            return self.peak_tflops[precision]
        return self.peak_tflops["bf16"]


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec(name="v100-16gb", arch="volta", memory_gib=15.8, peak_tflops={"fp16": 125.0, "bf16": 125.0},
                hbm_gbps=900, nvlink_gbps=150, network_gbps=12.5),
        GpuSpec(name="v100-32gb", arch="volta", memory_gib=31.7, peak_tflops={"fp16": 125.0, "bf16": 125.0},
                hbm_gbps=900, nvlink_gbps=150, network_gbps=12.5),
        GpuSpec(name="a100-40gb", arch="ampere", memory_gib=39.4, peak_tflops={"fp16": 312.0, "bf16": 312.0},
                hbm_gbps=1555, nvlink_gbps=300, network_gbps=25),
        GpuSpec(name="a100-80gb", arch="ampere", memory_gib=79.35, peak_tflops={"fp16": 312.0, "bf16": 312.0},
                hbm_gbps=2039, nvlink_gbps=300, network_gbps=25),
        GpuSpec(name="h100-sxm", arch="hopper", memory_gib=79.6,
                peak_tflops={"fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
                hbm_gbps=3350, nvlink_gbps=450, network_gbps=50),
        GpuSpec(name="h200", arch="hopper", memory_gib=140.4,
                peak_tflops={"fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
                hbm_gbps=4800, nvlink_gbps=450, network_gbps=50),
        GpuSpec(name="b200", arch="blackwell", memory_gib=178.4,
                peak_tflops={"fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=50),
        GpuSpec(name="gb200", arch="blackwell", memory_gib=184.0,
                peak_tflops={"fp16": 2450.0, "bf16": 2450.0, "fp8": 4900.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=50),
        GpuSpec(name="b300", arch="blackwell", memory_gib=268.0,
                peak_tflops={"fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=100),
        GpuSpec(name="gb300", arch="blackwell", memory_gib=275.0,
                peak_tflops={"fp16": 2450.0, "bf16": 2450.0, "fp8": 4900.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=100),
        # Not a GPU: one CPU process of a CPU run (torchrun + gloo, tiny models), so that such runs
        # have an MFU to tune. Nominal figures: the peak is about one x86 server core's bf16 matmul
        # rate (1024^3 GEMM, torch 2.13, one thread: 0.12 TFLOP/s; fp32 0.03), memory a per-process
        # share of a 24 GB host, bandwidths those of host memory and gloo over loopback. Host RSS is
        # no OOM signal, so CPU runs report no device memory.
        GpuSpec(name="cpu", arch="cpu", memory_gib=6.0, peak_tflops={"fp16": 0.1, "bf16": 0.1, "fp8": 0.1},
                hbm_gbps=20, nvlink_gbps=2, network_gbps=1),
    ]
}

# Spellings seen in published tables and in `nvidia-smi` names.
_ALIASES = {
    "a100": "a100-80gb",
    "a100-80g": "a100-80gb",
    "a100-sxm4-80gb": "a100-80gb",
    "a100-sxm4-40gb": "a100-40gb",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "h100-80gb-hbm3": "h100-sxm",
    "h100-sxm5-80gb": "h100-sxm",
    "h200-141gb": "h200",
    "v100-sxm2-16gb": "v100-16gb",
    "v100-sxm2-32gb": "v100-32gb",
}


def normalize_gpu_name(raw: str) -> str:
    """Maps 'A100-80GB (Selene)', 'NVIDIA H100 80GB HBM3', 'GB200' to catalog keys."""
    text = re.sub(r"\(.*?\)", "", raw).strip().lower()
    text = text.removeprefix("nvidia").strip()
    text = re.sub(r"[\s_]+", "-", text)
    return _ALIASES.get(text, text)


def lookup_gpu(raw: str) -> GpuSpec:
    """The catalog entry for `raw`; KeyError names the known GPUs."""
    key = normalize_gpu_name(raw)
    if key not in GPUS:
        raise KeyError(f"unknown GPU {raw!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]

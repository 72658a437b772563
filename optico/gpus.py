"""GPU catalog: memory, dense peak throughput per precision, bandwidths.

Peaks are the vendors' dense (no sparsity) figures. Bandwidths are per GPU and
one direction: `nvlink_gbps` inside a node, `network_gbps` between nodes (the
NIC share of one GPU). They feed the performance model and MFU.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["bf16", "fp16", "fp8"]


class GpuSpec(BaseModel):
    """One accelerator model."""

    model_config = ConfigDict(frozen=True)

    name: str
    arch: str = Field(description="Generation: volta, ampere, ada, hopper, blackwell, cdna3 — efficiencies differ "
                                  "by it.")
    memory_gib: float = Field(description="Device memory the framework can use, GiB.")
    peak_tflops: dict[str, float] = Field(description="Dense peak TFLOP/s per precision.")
    hbm_gbps: float = Field(description="Memory bandwidth, GB/s.")
    nvlink_gbps: float = Field(description="Intra-node bandwidth per GPU per direction, GB/s.")
    network_gbps: float = Field(description="Inter-node bandwidth per GPU per direction, GB/s.")
    host_gbps: float = Field(25.0, description="Host-device copy bandwidth per direction, GB/s (PCIe, or the "
                                               "C2C link of Grace-Hopper/Blackwell superchips): activation "
                                               "offloading's link.")
    source: str = Field("", description="Where the figures come from (vendor datasheet).")

    def peak(self, precision: str) -> float:
        """Dense peak TFLOP/s for `precision`. A workload refuses a precision its GPU has no tensor
        cores for (`Workload`); unchecked, fp8 falls back to bf16 and bf16 to fp16."""
        for name in (precision, "bf16", "fp16"):
            if name in self.peak_tflops:
                return self.peak_tflops[name]
        raise KeyError(f"{self.name} has no peak for {precision}")


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
_A800 = "NVIDIA A800 Tensor Core GPU datasheet (A100 silicon, NVLink limited to 400 GB/s)"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet); dense = half the sparse figures"
_H100NVL = ("NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column: 94 GB HBM3 (nvidia-smi: 95,830 MiB) at 3.9 TB/s, "
            "1,671 BF16 / 3,341 FP8 TFLOPS with sparsity, NVLink bridge 600 GB/s between a pair, PCIe Gen5")
_H800 = "NVIDIA H800 Tensor Core GPU datasheet (H100 SXM silicon, NVLink 400 GB/s)"
_H20 = "NVIDIA H20 product brief (96 GB HBM3, 4.0 TB/s, 148 dense BF16 / 296 FP8 TFLOPS, NVLink 900 GB/s)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/)"
_L40S = "NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s/): 362 dense BF16, 733 dense FP8 TFLOPS, 48 GB GDDR6, PCIe Gen4"
_B200 = "NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx/): per GPU 2.25 PF dense FP16/BF16, 4.5 PF FP8"
_GB200 = "NVIDIA GB200 NVL72 datasheet (nvidia.com/en-us/data-center/gb200-nvl72/): 180 PF dense BF16 per 72 GPUs; the DGX Cloud READMEs' MFU formula uses 2450/4900"
_B300 = "NVIDIA HGX B300 / GB300 NVL72 datasheets (nvidia.com/en-us/data-center/gb300-nvl72/)"
_MI300X = "AMD Instinct MI300X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html): 1307.4 dense BF16, 2614.9 dense FP8 TFLOPS, 192 GB HBM3 at 5.3 TB/s, 7 Infinity Fabric links of 64 GB/s per direction"
_MI325X = "AMD Instinct MI325X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi325x.html): 1307.4 dense BF16, 2614.9 dense FP8 TFLOPS, 256 GB HBM3E at 6 TB/s"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet (125 TFLOPS tensor, NVLink 300 GB/s)"

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        # Volta's tensor cores do fp16 only: bf16 there is emulated (compute capability 7.0).
        GpuSpec(name="v100-16gb", arch="volta", memory_gib=15.8, peak_tflops={"fp16": 125.0},
                hbm_gbps=900, nvlink_gbps=150, network_gbps=12.5, host_gbps=12, source=_V100),
        GpuSpec(name="v100-32gb", arch="volta", memory_gib=31.7, peak_tflops={"fp16": 125.0},
                hbm_gbps=900, nvlink_gbps=150, network_gbps=12.5, host_gbps=12, source=_V100),
        GpuSpec(name="a100-40gb", arch="ampere", memory_gib=39.4, peak_tflops={"fp16": 312.0, "bf16": 312.0},
                hbm_gbps=1555, nvlink_gbps=300, network_gbps=25, source=_A100),
        GpuSpec(name="a100-80gb", arch="ampere", memory_gib=79.35, peak_tflops={"fp16": 312.0, "bf16": 312.0},
                hbm_gbps=2039, nvlink_gbps=300, network_gbps=25, source=_A100),
        GpuSpec(name="a800-80gb", arch="ampere", memory_gib=79.35, peak_tflops={"fp16": 312.0, "bf16": 312.0},
                hbm_gbps=2039, nvlink_gbps=200, network_gbps=25, source=_A800),
        GpuSpec(name="h100-sxm", arch="hopper", memory_gib=79.6,
                peak_tflops={"fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
                hbm_gbps=3350, nvlink_gbps=450, network_gbps=50, host_gbps=50, source=_H100),
        GpuSpec(name="h100-pcie", arch="hopper", memory_gib=79.6,
                peak_tflops={"fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
                hbm_gbps=2000, nvlink_gbps=300, network_gbps=50, host_gbps=50, source=_H100),
        GpuSpec(name="h100-nvl", arch="hopper", memory_gib=93.6,
                peak_tflops={"fp16": 835.5, "bf16": 835.5, "fp8": 1670.5},
                hbm_gbps=3900, nvlink_gbps=300, network_gbps=50, host_gbps=50, source=_H100NVL),
        GpuSpec(name="h800-sxm", arch="hopper", memory_gib=79.6,
                peak_tflops={"fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
                hbm_gbps=3350, nvlink_gbps=200, network_gbps=50, host_gbps=50, source=_H800),
        GpuSpec(name="h20", arch="hopper", memory_gib=95.0,
                peak_tflops={"fp16": 148.0, "bf16": 148.0, "fp8": 296.0},
                hbm_gbps=4000, nvlink_gbps=450, network_gbps=50, host_gbps=50, source=_H20),
        GpuSpec(name="h200", arch="hopper", memory_gib=140.4,
                peak_tflops={"fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
                hbm_gbps=4800, nvlink_gbps=450, network_gbps=50, host_gbps=50, source=_H200),
        GpuSpec(name="l40s", arch="ada", memory_gib=44.5,
                peak_tflops={"fp16": 362.0, "bf16": 362.0, "fp8": 733.0},
                hbm_gbps=864, nvlink_gbps=25, network_gbps=25, source=_L40S),
        GpuSpec(name="b200", arch="blackwell", memory_gib=178.4,
                peak_tflops={"fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=50, host_gbps=50, source=_B200),
        GpuSpec(name="gb200", arch="blackwell", memory_gib=184.0,
                peak_tflops={"fp16": 2450.0, "bf16": 2450.0, "fp8": 4900.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=50, host_gbps=450, source=_GB200),
        GpuSpec(name="b300", arch="blackwell", memory_gib=268.0,
                peak_tflops={"fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=100, host_gbps=50, source=_B300),
        GpuSpec(name="gb300", arch="blackwell", memory_gib=275.0,
                peak_tflops={"fp16": 2450.0, "bf16": 2450.0, "fp8": 4900.0},
                hbm_gbps=8000, nvlink_gbps=900, network_gbps=100, host_gbps=450, source=_B300),
        GpuSpec(name="mi300x", arch="cdna3", memory_gib=191.5,
                peak_tflops={"fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
                hbm_gbps=5300, nvlink_gbps=448, network_gbps=50, host_gbps=50, source=_MI300X),
        GpuSpec(name="mi325x", arch="cdna3", memory_gib=255.5,
                peak_tflops={"fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
                hbm_gbps=6000, nvlink_gbps=448, network_gbps=50, host_gbps=50, source=_MI325X),
        # Not a GPU: one CPU process of a CPU run (torchrun + gloo, tiny models), so that such runs
        # have an MFU to tune. Nominal figures: the peak is about one x86 server core's bf16 matmul
        # rate (1024^3 GEMM, torch 2.13, one thread: 0.12 TFLOP/s; fp32 0.03), memory a per-process
        # share of a 24 GB host, bandwidths those of host memory and gloo over loopback. Host RSS is
        # no OOM signal, so CPU runs report no device memory.
        GpuSpec(name="cpu", arch="cpu", memory_gib=6.0, peak_tflops={"fp16": 0.1, "bf16": 0.1, "fp8": 0.1},
                hbm_gbps=20, nvlink_gbps=2, network_gbps=1, host_gbps=20, source="nominal (see comment)"),
    ]
}

# Words in names as sources write them that say nothing about which catalog entry is meant.
_NOISE = {"nvidia", "amd", "instinct", "tesla", "sxm", "sxm2", "sxm4", "sxm5", "hgx", "dgx", "gpu", "gpus",
          "hbm", "hbm2", "hbm2e", "hbm3", "hbm3e", "oam", "tensor", "core", "x"}
_MEMORY = re.compile(r"^(\d+)(gb|g|gib)?$")


# Models sold with more than one memory size: the catalog key per size stated in GB, and under None
# the one a table that writes the bare model means (the published tables' "A100 (DGX-A100)" ran on
# 80 GB parts). A spec must say which (`gpu_key`): an A100-40GB read as 80 GB would have every memory
# prediction off by half.
_SIZES: dict[str, dict[int | None, str]] = {
    "a100": {40: "a100-40gb", 80: "a100-80gb", None: "a100-80gb"},
    "v100": {16: "v100-16gb", 32: "v100-32gb", None: "v100-16gb"},
}


def _parse(raw: str) -> tuple[str, str | None, int | None]:
    """(catalog key or the name lower-cased and dashed, the model word, the memory size stated in GB)."""
    text = re.sub(r"\(.*?\)", " ", raw).strip().lower()
    if text in GPUS:
        return text, None, None
    tokens = [t for t in re.split(r"[\s_\-/,]+", text) if t]
    model, memory, variant = None, None, None
    for token in tokens:
        size = _MEMORY.match(token)
        if size and token[0].isdigit():
            memory = int(size.group(1))
        elif token in ("pcie", "pci", "nvl"):
            variant = "nvl" if token == "nvl" else "pcie"
        elif token not in _NOISE and model is None:
            joined = re.match(r"^([a-z]+\d+[a-z]*?)(\d+gb)?$", token)  # 'a100' or 'h100' or 'a10080gb'
            model = joined.group(1) if joined else token
            if joined and joined.group(2):
                memory = int(joined.group(2)[:-2])
    unplaced = re.sub(r"[\s_]+", "-", text)
    if model is None:
        return unplaced, None, memory
    if model in _SIZES:
        return _SIZES[model].get(memory, _SIZES[model][None]), model, memory
    if model == "a800":
        return "a800-80gb", model, memory
    if model == "h100":
        return f"h100-{variant or 'sxm'}", model, memory
    if model == "h800":
        return "h800-sxm", model, memory
    return (model if model in GPUS else unplaced), model, memory


@lru_cache(maxsize=4096)  # once per distinct cell
def normalize_gpu_name(raw: str) -> str:
    """The catalog key for a name as sources write it: 'A100-80GB (Selene)', 'NVIDIA H100 80GB HBM3',
    'H100-SXM-80GB', 'H100 NVL', 'A800-80GB', 'H800', 'GB200 (DGX-GB200)', 'AMD Instinct MI300X', 'L40S'.
    A name it cannot place comes back lower-cased and dashed (not a key: callers say so)."""
    return _parse(raw)[0]


def gpu_key(raw: str) -> str:
    """The catalog key for a GPU a user names (a spec's `cluster.gpu`): as `normalize_gpu_name`, but a
    model sold with several memory sizes must say which. ValueError says what is missing."""
    key, model, memory = _parse(raw)
    if model in _SIZES and memory is None:
        sizes = sorted({k for m, k in _SIZES[model].items() if m is not None})
        raise ValueError(f"{raw[:60]!r} does not say its memory size: {' or '.join(sizes)}")
    if key not in GPUS:
        raise ValueError(_unknown(raw))
    return key


def _unknown(raw: str) -> str:
    return f"unknown GPU {raw[:60]!r}; known: {', '.join(sorted(GPUS))}"


def lookup_gpu(raw: str) -> GpuSpec:
    """The catalog entry for `raw`; KeyError names the known GPUs."""
    key = normalize_gpu_name(raw)
    if key not in GPUS:
        raise KeyError(_unknown(raw))
    return GPUS[key]

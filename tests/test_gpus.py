"""The GPU catalog: every entry with its source, names matched as sources write them."""

from __future__ import annotations

import pytest

from optico.gpus import GPUS, lookup_gpu, normalize_gpu_name


def test_every_gpu_has_a_source_and_dense_peaks():
    for key, gpu in GPUS.items():
        assert gpu.source, key
        assert gpu.peak("bf16") > 0 and gpu.memory_gib > 0 and gpu.host_gbps > 0
    for key in ("a800-80gb", "h800-sxm", "h20", "l40s", "h200", "b200", "gb200", "mi300x", "mi325x"):
        assert key in GPUS


@pytest.mark.parametrize("written, key", [
    ("A800-80GB", "a800-80gb"), ("H800-80GB", "h800-sxm"), ("H800", "h800-sxm"), ("H100-SXM-80GB", "h100-sxm"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("H100 (DGX-H100)", "h100-sxm"), ("H100-80GB (DGX-H100)", "h100-sxm"),
    ("H100 PCIe", "h100-pcie"), ("A100 (DGX-A100, OCI draco)", "a100-80gb"), ("A100-80GB (Selene)", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("V100-SXM2-16GB", "v100-16gb"), ("V100-SXM2-32GB", "v100-32gb"),
    ("H20", "h20"), ("L40S", "l40s"), ("H200-141GB", "h200"), ("GB200 (DGX-GB200)", "gb200"),
    ("B300 (DGX-B300)", "b300"), ("AMD Instinct MI300X", "mi300x"), ("MI325X", "mi325x"), ("h100-sxm", "h100-sxm"),
])
def test_names_as_sources_write_them(written: str, key: str):
    assert normalize_gpu_name(written) == key
    assert lookup_gpu(written).name == key


def test_an_unknown_gpu_is_named():
    with pytest.raises(KeyError, match="unknown GPU 'TPU-v5'"):
        lookup_gpu("TPU-v5")


@pytest.mark.parametrize("written", ["H100 NVL", "NVIDIA H100 NVL", "h100-nvl"])
def test_h100_nvl_is_its_own_part(written: str):
    # 94 GB and 835 dense BF16 TFLOPS: read as an H100 SXM it had 14 GiB less memory and an MFU 16 % low.
    assert normalize_gpu_name(written) == "h100-nvl"
    assert GPUS["h100-nvl"].memory_gib > GPUS["h100-sxm"].memory_gib
    assert GPUS["h100-nvl"].peak("bf16") < GPUS["h100-sxm"].peak("bf16")


@pytest.mark.parametrize("written, sizes", [("a100", "a100-40gb or a100-80gb"), ("NVIDIA A100", "a100-40gb or a100-80gb"),
                                            ("V100-SXM2", "v100-16gb or v100-32gb")])
def test_a_spec_must_say_which_memory_size_a_model_sold_in_several_has(written: str, sizes: str):
    from optico.errors import SpecError
    from optico.spec import parse_spec_text

    text = ("workload:\n  model: {preset: llama3-8b}\n  seq_length: 4096\n  global_batch_size: 512\n"
            f"  cluster: {{gpu: '{written}', gpus_per_node: 8, nodes: 1}}\n")
    with pytest.raises(SpecError, match=f"workload.cluster.gpu: .* does not say its memory size: {sizes}"):
        parse_spec_text(text, origin_name="x.yaml")
    # A table that writes the bare model still reads as the part its runs had.
    assert normalize_gpu_name(written) in sizes.split(" or ")

"""Framework probes of the real launcher kinds: the local one starts the training interpreter for real."""

from __future__ import annotations

from importlib import metadata

import pytest
from retune_testkit import sim_spec

from optico.retune.probe import ProbeError, probe_framework
from optico.spec import parse_spec

REPLAY = "optico/data/optico_llama3_8b_a100.csv"


def test_the_local_probe_reads_the_versions_the_training_processes_would_import() -> None:
    try:  # what is installed, read without importing torch here (seconds on a busy machine)
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        pytest.skip("torch is not installed")
    spec = parse_spec({**sim_spec(), "launcher": {"kind": "local"}})
    found = probe_framework(spec)
    assert found["torch"] == torch_version
    assert found.get("megatron_core") == metadata.version("megatron-core")
    assert set(found) <= {"megatron_core", "torch", "cuda", "nccl", "transformer_engine", "image"}


def test_the_local_probe_fails_in_one_line_when_the_interpreter_is_missing() -> None:
    spec = parse_spec({**sim_spec(), "launcher": {"kind": "local",
                                                  "program": {"kind": "megatron-core", "python": "/nonexistent/python"}}})
    with pytest.raises(ProbeError, match="the probe launch failed") as info:
        probe_framework(spec)
    assert "\n" not in str(info.value)


def test_a_replay_table_is_its_own_cluster(tmp_path) -> None:
    from pathlib import Path

    from optico.spec import load_spec

    source = Path(__file__).resolve().parents[2] / REPLAY
    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "llama3-8b-a100-replay.yaml")
    spec = spec.model_copy(update={"launcher": spec.launcher.model_copy(update={"data": str(source)})})
    first = probe_framework(spec)
    copy = tmp_path / "changed.csv"
    copy.write_text(source.read_text() + "\n")
    assert probe_framework(spec.model_copy(update={"launcher": spec.launcher.model_copy(update={"data": str(copy)})})) \
        != first == probe_framework(spec)

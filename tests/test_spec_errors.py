"""Malformed or impossible specs: one-line error naming the field, exit code 2, nothing in the pool."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from optico.errors import SpecError
from optico.spec import parse_spec_text
from tests.conftest import optico_cmd

GOOD = """
name: t
workload:
  model: llama3-8b
  seq_length: 8192
  global_batch_size: 512
  precision: bf16
  cluster: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1}
search_space:
  tunables: [tp, pp, mbs]
  fixed: {use_distributed_optimizer: true}
"""

# (spec text, the field the error must name, a word of the reason)
CASES = [
    ("workload: [unclosed", "not valid YAML", "line"),
    ("- just\n- a list\n", "must be a mapping", "list"),
    (GOOD.replace("model: llama3-8b", "model: llama9-1t"), "workload.model", "unknown preset"),
    (GOOD.replace("seq_length: 8192", "seq_length: -4096"), "workload.seq_length", "greater than 0"),
    (GOOD.replace("global_batch_size: 512", "global_batch_size: 0"), "workload.global_batch_size", "greater than 0"),
    (GOOD.replace("precision: bf16", "precision: fp64"), "workload.precision", "bf16"),
    (GOOD.replace("gpu: a100-80gb", "gpu: x100"), "workload.cluster.gpu", "unknown GPU"),
    # A credential pasted into the wrong field is quoted masked, like every printed text.
    (GOOD.replace("gpu: a100-80gb", "gpu: sk-q7Zxq7Zxq7Zxq7Zxq7Zx"), "workload.cluster.gpu", "unknown GPU '***'"),
    (GOOD.replace("nodes: 1}", "nodes: 1, num_gpus: 16}"), "workload.cluster", "more than the cluster has"),
    (GOOD.replace("gpus_per_node: 8", "gpus_per_node: -8"), "workload.cluster.gpus_per_node", "greater than 0"),
    (GOOD.replace("model: llama3-8b", "model: {preset: llama3-8b, num_attention_heads: 30, num_query_groups: 30, "
                                      "kv_channels: 128}")
     .replace("tunables: [tp, pp, mbs]", "tunables: {tp: [4, 8], pp: [1], mbs: [1]}"),
     "search_space.tunables.tensor_model_parallel_size", "num_attention_heads (30)"),
    (GOOD.replace("global_batch_size: 512", "global_batch_size: 3")
     .replace("tunables: [tp, pp, mbs]", "tunables: {tp: [1, 2], pp: [1], mbs: [1, 2]}"),
     "workload.global_batch_size", "not divisible"),
    (GOOD.replace("tunables: [tp, pp, mbs]", "tunables: [tp, pp, turbo_mode]"), "search_space.tunables",
     "unknown strategy parameter 'turbo_mode'"),
    (GOOD.replace("tunables: [tp, pp, mbs]", "tunables: {tp: [1, -2]}"), "search_space.tunables.tp",
     "not a valid tensor_model_parallel_size"),
    # The recompute details mean nothing without full recompute, and checked alone any value passed:
    # a bad one reached the search space and ended `tune` in a traceback (found by fuzzing specs).
    (GOOD.replace("tunables: [tp, pp, mbs]", "tunables: {recompute: [full], recompute_num_layers: [[1, 2], 3]}"),
     "search_space.tunables.recompute_num_layers", "valid integer"),
    (GOOD.replace("tunables: [tp, pp, mbs]", "tunables: {recompute: [full], recompute_num_layers: [0]}"),
     "search_space.tunables.recompute_num_layers", "greater than 0"),
    (GOOD.replace("tunables: [tp, pp, mbs]", "tunables: {recompute: [full], recompute_method: [sideways]}"),
     "search_space.tunables.recompute_method", "'uniform' or 'block'"),
    (GOOD.replace("fixed: {use_distributed_optimizer: true}", "fixed: {recompute: full, recompute_num_layers: x}"),
     "search_space.fixed.recompute_num_layers", "valid integer"),
    (GOOD + "baseline: {tp: 1, recompute: full, recompute_method: sideways}\n", "baseline.recompute_method",
     "'uniform' or 'block'"),
    (GOOD + "baseline: {tp: 3, pp: 1, mbs: 1}\n", "baseline.tensor_model_parallel_size", "divisible"),
    (GOOD + "baseline: {tp: 2, pp: 1, mbs: 1, warp_speed: 9}\n", "baseline", "unknown strategy parameter"),
    # The field set off its default is named, not the first one the rule reads (TP, left at 1).
    (GOOD + "baseline: {tp: 1, pp: 5}\n", "baseline.pipeline_model_parallel_size", "divisible by TP·PP·CP"),
    # Transformer Engine's fp8 needs fp8 tensor cores: an A100 run was accepted and measured against bf16.
    (GOOD.replace("precision: bf16", "precision: fp8"), "workload.precision", "fp8 needs a GPU with fp8"),
    (GOOD.replace("gpu: a100-80gb", "gpu: v100-32gb"), "workload.precision",
     "bf16 needs a GPU with bf16 tensor cores; v100-32gb has none (use fp16)"),
    (GOOD.replace("precision: bf16", "precision: fp8\n  attention_backend: local")
     .replace("gpu: a100-80gb", "gpu: h100-sxm"), "workload.precision", "fp8 needs Transformer Engine"),
    (GOOD.replace("precision: bf16", "precision: bf16\n  attention_backend: local\n  cross_entropy_fusion_impl: te"),
     "workload.cross_entropy_fusion_impl", "te needs Transformer Engine"),
    (GOOD.replace("precision: bf16", "precision: bf16\n  cross_entropy_fusion_impl: apex"),
     "workload.cross_entropy_fusion_impl", "'native' or 'te'"),
    (GOOD.replace("model: llama3-8b", "model: {preset: nemotron-h-8b, mamba_num_heads: 100}"), "workload.model",
     "Mamba heads (100) must be divisible by mamba_num_groups (8)"),
    # The advice survives the one-line clip: it comes before the list of domain sizes.
    (GOOD.replace("tunables: [tp, pp, mbs]", "tunables: [tp, pp, vpp, mbs, sp, recompute, recompute_method, "
                  "recompute_num_layers, overlap_grad_reduce, cross_entropy_loss_fusion, "
                  "decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers]"),
     "search_space.tunables", "tune fewer knobs or list fewer values"),
    (GOOD + "budget: {max_trials: 0}\n", "budget.max_trials", "greater than 0"),
    (GOOD + "budget: {target_mfu: 1.5}\n", "budget.target_mfu", "less than or equal to 1"),
    (GOOD + "launcher: {kind: slurm}\n", "launcher.kind", "sim"),
    (GOOD + "launcher: {kind: replay}\n", "launcher.data", "replay launcher needs"),
    (GOOD + "launcher: {kind: replay, data: nowhere.csv}\n", "launcher.data", "no such file"),
    (GOOD + "colour: blue\n", "colour", "unknown field"),
    # A field named like a secret: joined, 'launcher.password: unknown field' read as an assignment and
    # the reason was masked ('launcher.password: *** field').
    (GOOD + "launcher: {kind: sim, password: hunter22}\n", "launcher.password", "unknown field"),
    # The same with the reason: '..._API_KEY: OptiCo's own variables' was printed '..._API_KEY: ***'s own'.
    (GOOD + "launcher: {kind: sim, env: {OPENAI_API_KEY: '***'}}\n", "launcher.env.OPENAI_API_KEY",
     "one of OptiCo's own variables"),
    (GOOD + "launcher: {kind: sim, pass_env: [OPTICO_LLM_API_KEY]}\n", "launcher.pass_env",
     "one of OptiCo's own variables"),
    (GOOD.replace("workload:", "workload:\n  tokenizer: gpt2"), "workload.tokenizer", "unknown field"),
    (GOOD + "reasoner: {analysis: magic}\n", "reasoner.analysis", "rules"),
    # One past the bound, said in full (it read '4.29497e+09 is outside ... to 4.29497e+09').
    (GOOD + "launcher: {kind: sim, seed: 4294967296}\n", "launcher.seed",
     "4,294,967,296 is outside the allowed range 0 to 4,294,967,295"),
    (GOOD + "calibration: nowhere.json\n", "calibration", "no such file"),
    (GOOD.replace("seq_length: 8192", "seq_length: 8192\n  extra_layers: 3"), "workload.extra_layers",
     "unknown field"),
]


@pytest.mark.parametrize("text,field,reason", CASES, ids=[c[1] + ":" + c[2][:20] for c in CASES])
def test_bad_spec_exits_2_naming_the_field(tmp_path: Path, cli_env: dict, text: str, field: str, reason: str):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    proc = subprocess.run(optico_cmd("tune", str(spec)), env=cli_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert message.startswith("error:"), message
    assert field in message and reason in message, message
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # one line (rich may wrap once)
    assert not (tmp_path / "pool.db").exists(), "nothing may be written to the pool"


def test_missing_spec_file(tmp_path: Path, cli_env: dict):
    proc = subprocess.run(optico_cmd("tune", str(tmp_path / "nope.yaml")), env=cli_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "no such spec file" in proc.stderr
    assert not (tmp_path / "pool.db").exists()


def test_exponent_floats_are_numbers_in_yaml_and_json_bodies_alike():
    # YAML 1.1 reads "1e-05" as a string; JSON (and YAML 1.2) as a number, and json.dumps writes small
    # floats that way, so a JSON body sent to the service was refused ("got str '1e-05'").
    spec = parse_spec_text(GOOD + "launcher: {kind: sim, noise: 1e-05, trial_seconds: 2E+0}\n")
    assert spec.launcher.noise == 1e-05 and spec.launcher.trial_seconds == 2.0
    body = json.dumps({**yaml.safe_load(GOOD), "launcher": {"kind": "sim", "noise": 0.00001}})
    assert "1e-05" in body and parse_spec_text(body).launcher.noise == 1e-05
    assert parse_spec_text(GOOD.replace("name: t", "name: '1e5'")).name == "1e5"  # quoted, still a string


def test_json_escapes_of_a_character_beyond_the_bmp_read_as_that_character():
    # json.dumps writes an emoji as two escaped surrogates; YAML alone would see two lone ones and refuse.
    body = json.dumps({**yaml.safe_load(GOOD), "name": "llama \U0001f999 run"})
    assert "\\ud83e\\udd99" in body and parse_spec_text(body).name == "llama \U0001f999 run"
    with pytest.raises(SpecError, match="lone surrogate"):
        parse_spec_text(json.dumps({**yaml.safe_load(GOOD), "name": "x\ud800"}))


def test_a_refused_value_is_named_where_it_is_written_first():
    # An anchor comes before its aliases: the value is named there, with that line, and the first of
    # two bad values is the one reported.
    with pytest.raises(SpecError) as anchored:
        parse_spec_text("name: x\nlauncher: {noise: &n .inf}\nworkload: {seq_length: *n}\n", origin_name="s.yaml")
    assert (anchored.value.field, str(anchored.value).endswith("(s.yaml, line 2)")) == ("launcher.noise", True)
    with pytest.raises(SpecError) as first:
        parse_spec_text("seed: .nan\nname: .inf\n", origin_name="s.yaml")
    assert first.value.field == "seed"


def test_a_credential_in_a_spec_name_is_printed_masked_as_it_is_stored(tmp_path: Path, cli_env: dict):
    """The pool keeps a name redacted; the lines `tune` and `jobs submit` print about it did not."""
    key = "ghp_" + "a1B2" * 9
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD.replace("name: t", f"name: run {key}") + "budget: {max_trials: 1}\nlauncher: {kind: sim}\n")
    for argv in (("jobs", "submit", str(spec)), ("tune", str(spec))):
        proc = subprocess.run(optico_cmd(*argv), env=cli_env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert key not in proc.stdout + proc.stderr and "run ***" in proc.stdout, proc.stdout


def test_a_spec_without_a_name_from_a_file_named_only_spaces_is_a_job_named_job():
    """`   .yaml` without `name:` was refused as "name: shows nothing", a field the spec does not have."""
    unnamed = GOOD.replace("name: t\n", "")
    assert parse_spec_text(unnamed, origin_name="   .yaml").name == "job"
    assert parse_spec_text(unnamed, origin_name="nightly llama.yaml").name == "nightly llama"

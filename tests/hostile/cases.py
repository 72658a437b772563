"""Hostile specs, generated from tables: each is a spec (YAML text or a mapping dumped to YAML), the
files it names, and the field its one-line error must start with.

The families cover the bounds `optico.spec` promises rather than a list of known attacks: the
text itself (encoding, size, depth, aliases, tags, duplicates), each type (booleans, strings and
floats where integers go), each magnitude, the search space's size, and every file a spec names
(replay CSV, calibration JSON)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PAPER_CSV = (REPO / "optico" / "data" / "optico_llama3_8b_a100.csv").read_text()

GOOD: dict[str, Any] = {
    "name": "hostile",
    "workload": {"model": "llama3-8b", "seq_length": 8192, "global_batch_size": 512, "precision": "bf16",
                 "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1}},
    "search_space": {"tunables": ["tp", "pp", "mbs"], "fixed": {"use_distributed_optimizer": True}},
}
REPLAY: dict[str, Any] = {
    "name": "hostile-replay",
    "workload": {"model": "llama3-8b", "seq_length": 8192, "global_batch_size": 512, "precision": "fp16",
                 "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1}},
    "search_space": {"tunables": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "mbs": [1, 2]},
                     "fixed": {"use_distributed_optimizer": True}},
    "launcher": {"kind": "replay", "data": "runs.csv"},
}

TINY_CPU: dict[str, Any] = {
    "name": "hostile-cpu",
    "workload": {"model": "tiny-gpt", "seq_length": 64, "global_batch_size": 8,
                 "cluster": {"gpu": "cpu", "gpus_per_node": 2, "nodes": 1}},
    "search_space": {"tunables": {"tp": [1, 2], "mbs": [1, 2]}},
}


@dataclass
class Case:
    id: str
    spec: bytes | dict[str, Any]
    field: str  # the error line starts with `error: <field>`
    files: dict[str, bytes] = field(default_factory=dict)

    def write(self, folder: Path) -> Path:
        for name, content in self.files.items():
            (folder / name).write_bytes(content)
        text = self.spec if isinstance(self.spec, bytes) else yaml.safe_dump(self.spec, sort_keys=False).encode()
        path = folder / "spec.yaml"
        path.write_bytes(text)
        return path


def edit(base: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of `base` with `dotted` (a.b.c) set to `value` (`...` deletes it)."""
    spec = copy.deepcopy(base)
    *parents, last = dotted.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    if value is ...:
        node.pop(last, None)
    else:
        node[last] = value
    return spec


def good_yaml() -> str:
    return yaml.safe_dump(GOOD, sort_keys=False)


def csv_with(row_edit: dict[str, str], header_edit: str | None = None) -> bytes:
    """The OptiCo paper's table with the first ok row's cells replaced."""
    lines = PAPER_CSV.splitlines()
    header = lines[0].split(",")
    import csv
    import io

    rows = list(csv.reader(io.StringIO(PAPER_CSV)))
    for row in rows[1:]:
        if row[header.index("result")] == "ok":
            for name, value in row_edit.items():
                row[header.index(name)] = value
            break
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    text = out.getvalue()
    if header_edit is not None:
        text = header_edit + "\n" + text.split("\n", 1)[1]
    return text.encode()


def _nested_lists(depth: int) -> bytes:
    return (good_yaml() + "launcher: {runtime_env: {x: " + "[" * depth + "]" * depth + "}}\n").encode()


def _nested_maps(depth: int) -> bytes:
    return (good_yaml() + "launcher: {runtime_env: " + "{k: " * depth + "v" + "}" * depth + "}\n").encode()


def _laughs(levels: int = 9, width: int = 9) -> bytes:
    lines = ["  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return (good_yaml() + "launcher:\n  runtime_env:\n" + "\n".join(lines) + "\n").encode()


# -- the text itself -----------------------------------------------------------------------------------
TEXT_CASES = [
    Case("latin-1 byte", good_yaml().replace("hostile", "hostil\xe9").encode("latin-1"), "spec.yaml"),
    Case("utf-16", good_yaml().encode("utf-16"), "spec.yaml"),
    Case("binary png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "spec.yaml"),
    Case("empty file", b"", "spec.yaml"),
    Case("only a comment", b"# nothing here\n", "spec.yaml"),
    Case("300 KB of comments", good_yaml().encode() + b"#" + b"x" * 300_000 + b"\n", "spec.yaml"),
    Case("50 MB name", b"name: " + b"x" * 50_000_000 + b"\n", "spec.yaml"),
    Case("20000 nested lists", _nested_lists(20_000), "spec.yaml"),
    Case("20000 nested mappings", _nested_maps(20_000), "spec.yaml"),
    Case("40 nested block mappings", (good_yaml() + "launcher:\n  runtime_env:\n" + "".join(
        "  " * (i + 2) + f"k{i}:\n" for i in range(40))).encode(), "spec.yaml"),
    Case("alias bomb in runtime_env", _laughs(), "spec.yaml"),
    Case("recursive alias", (good_yaml() + "launcher: {runtime_env: &a {x: *a}}\n").encode(), "spec.yaml"),
    Case("duplicate top-level key", (good_yaml() + "name: again\n").encode(), "spec.yaml"),
    Case("duplicate nested key", good_yaml().replace("gpu: a100-80gb", "gpu: a100-80gb\n      gpu: h100-sxm")
         .encode(), "spec.yaml"),
    Case("two documents", (good_yaml() + "---\n" + good_yaml()).encode(), "spec.yaml"),
    Case("tab indentation", b"name: x\nworkload:\n\tmodel: llama3-8b\n", "spec.yaml"),
    # A value the loader refuses is named by its field (`error: workload.seq_length: ... (spec.yaml, line 3)`).
    Case("python object tag", (good_yaml() + "seed: !!python/object/apply:os.system [echo pwned]\n").encode(),
         "seed"),
    Case("binary tag", (good_yaml() + "launcher: {runtime_env: {x: !!binary aGVsbG8=}}\n").encode(), "launcher.runtime_env.x"),
    Case("set tag", (good_yaml() + "launcher: {runtime_env: {x: !!set {a, b}}}\n").encode(), "launcher.runtime_env.x"),
    Case("custom include tag", (good_yaml() + "calibration: !include /etc/passwd\n").encode(), "calibration"),
    Case("top-level list", b"- name: x\n- workload: y\n", "spec.yaml"),
    Case("top-level scalar", b"just a string\n", "spec.yaml"),
    Case("infinite seq_length", good_yaml().replace("seq_length: 8192", "seq_length: .inf").encode(), "workload.seq_length"),
    Case("nan noise", (good_yaml() + "launcher: {noise: .nan}\n").encode(), "launcher.noise"),
    Case("base-60 integer", good_yaml().replace("seq_length: 8192", "seq_length: " + ":".join(["59"] * 19)).encode(),
         "workload.seq_length"),
    Case("5000-digit integer", good_yaml().replace("seq_length: 8192", "seq_length: " + "9" * 5000).encode(),
         "workload.seq_length"),
    Case("lone surrogate in the name", good_yaml().replace("name: hostile", 'name: "x\\ud800"').encode(),
         "name"),
    Case("NUL in an env value", (good_yaml() + 'launcher: {env: {A: "x\\0y"}}\n').encode(), "launcher.env.A"),
    Case("a tag on text it cannot read", (good_yaml() + "launcher: {noise: !!float abc}\n").encode(),
         "launcher.noise"),
    Case("a bool tag on a word", (good_yaml() + "reasoner: {require_llm: !!bool maybe}\n").encode(),
         "reasoner.require_llm"),
    Case("an emoji key over a bad value", (good_yaml() + 'launcher: {runtime_env: {"\\ud83e\\udd99": 1e999}}\n')
         .encode(), "launcher.runtime_env.\U0001f999"),
    Case("boolean key", good_yaml().replace("precision: bf16", "precision: bf16\n  true: 1").encode(), "spec.yaml"),
    Case("yes as a key", good_yaml().replace("precision: bf16", "precision: bf16\n  yes: 1").encode(), "workload"),
    # YAML 1.1's surprises (YAML 1.2 dropped them): read silently, they changed the job that ran.
    Case("octal by a leading zero", good_yaml().replace("global_batch_size: 512", "global_batch_size: 01000")
         .encode(), "workload.global_batch_size"),
    Case("base-60 float", (good_yaml() + "budget: {gpu_hours: 1:30.5}\n").encode(), "budget.gpu_hours"),
    Case("yes for true", good_yaml().replace("use_distributed_optimizer: true", "use_distributed_optimizer: yes")
         .encode(), "search_space.fixed.use_distributed_optimizer"),
    Case("on for true", (good_yaml() + "reasoner: {require_llm: on}\n").encode(), "reasoner.require_llm"),
    # YAML 1.1's binary integers: "0b10000000000000" was read as 8192, a string to YAML 1.2 and JSON.
    Case("binary integer", good_yaml().replace("seq_length: 8192", "seq_length: 0b10000000000000").encode(),
         "workload.seq_length"),
    Case("binary integer by tag", good_yaml().replace("seq_length: 8192", "seq_length: !!int 0b11").encode(),
         "workload.seq_length"),
    # YAML 1.1 drops underscores in numbers: "6_4" was read as 64.
    Case("underscores in an integer", good_yaml().replace("seq_length: 8192", "seq_length: 8_192").encode(),
         "workload.seq_length"),
    Case("underscores in a float", (good_yaml() + "budget: {gpu_hours: 1_0.5}\n").encode(), "budget.gpu_hours"),
    Case("integer key", (good_yaml() + "1: one\n").encode(), "spec.yaml"),
    # A tag on the wrong kind of node: `!!map` on a scalar or a list crashed the constructor.
    Case("map tag on a scalar", (good_yaml() + "seed: !!map x\n").encode(), "seed"),
    Case("map tag on a list", (good_yaml() + "launcher: {runtime_env: {x: !!map [1]}}\n").encode(),
         "launcher.runtime_env.x"),
    Case("str tag on a mapping", (good_yaml() + "seed: !!str {a: 1}\n").encode(), "seed"),
    Case("unclosed flow", b"workload: [unclosed\n", "spec.yaml"),
]

# -- types and magnitudes: (dotted field, hostile value, the field the error names) ---------------------
FIELD_CASES: list[tuple[str, Any, str]] = [
    ("workload.cluster.gpus_per_node", True, "workload.cluster.gpus_per_node"),
    ("workload.cluster.nodes", "2", "workload.cluster.nodes"),
    ("workload.cluster.nodes", 1_000_000_000, "workload.cluster.nodes"),
    ("workload.cluster.num_gpus", 0, "workload.cluster.num_gpus"),
    ("workload.cluster.gpu", "x" * 5000, "workload.cluster.gpu"),
    ("workload.cluster.network_gbps", -1.0, "workload.cluster.network_gbps"),
    ("workload.seq_length", 1e29, "workload.seq_length"),
    ("workload.seq_length", "1e29", "workload.seq_length"),
    ("workload.seq_length", 10**18, "workload.seq_length"),
    ("workload.global_batch_size", 2**50, "workload.global_batch_size"),
    ("workload.global_batch_size", 512.0, "workload.global_batch_size"),
    ("workload.precision", "fp4", "workload.precision"),
    ("workload.model", {"preset": "llama3-8b", "num_layers": 1_000_000_000}, "workload.model.num_layers"),
    ("workload.model", {"preset": "llama3-8b", "hidden_size": 10**15}, "workload.model.hidden_size"),
    ("workload.model", {"preset": "llama3-8b", "vocab_size": 2**40}, "workload.model.vocab_size"),
    ("workload.model", {"preset": "llama3-8b", "num_attention_heads": 0}, "workload.model.num_attention_heads"),
    ("workload.model", {"preset": "llama3-8b", "swiglu": "yes"}, "workload.model.swiglu"),
    ("workload.model", {"preset": "llama3-8b", "name": "\x1b]0;pwned\x07"}, "workload.model.name"),
    ("workload.model", "x" * 10_000, "workload.model"),
    ("workload.model", {"preset": "deepseek-v3", "mtp_num_layers": 2**62}, "workload.model.mtp_num_layers"),
    ("workload.model", {"preset": "deepseek-v3", "kv_lora_rank": 2**62}, "workload.model.kv_lora_rank"),
    ("workload.model", {"preset": "mixtral-8x7b", "moe_layer_freq": [5] * 32}, "workload.model.moe_layer_freq"),
    ("workload.cluster", {"gpu": "h100\nerror: fake", "gpus_per_node": 8, "nodes": 1}, "workload.cluster.gpu"),
    ("workload.cluster", {"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "network_gbps": 1e-300},
     "workload.cluster.network_gbps"),
    ("workload.framework", {"megatron_core": "0.16\x1b[31m"}, "workload.framework.megatron_core"),
    ("workload.framework", {"image": "img\x1b]8;;http://evil\x07"}, "workload.framework.image"),
    ("workload.model", [1, 2], "workload.model"),
    # A list or mapping among the ablations went into a set: TypeError, unhashable.
    ("reasoner.ablate", [{"a": 1}], "reasoner.ablate.0"),
    ("reasoner.ablate", ["cot", ["history"]], "reasoner.ablate.1"),
    # Two names of one knob are a duplicate key (the last one won silently).
    ("search_space.fixed", {"pp": 1, "pipeline_model_parallel_size": 2},
     "search_space.fixed.pipeline_model_parallel_size"),
    ("baseline", {"tp": 1, "tensor_model_parallel_size": 2}, "baseline.tensor_model_parallel_size"),
    ("workload.model", ..., "workload.model"),
    ("workload.cluster", "8xA100", "workload.cluster"),
    ("search_space.tunables", [], "search_space.tunables"),
    ("search_space.tunables", {}, "search_space.tunables"),
    ("search_space.tunables", {"tp": []}, "search_space.tunables.tp"),
    ("search_space.tunables", {"tp": [True, 2]}, "search_space.tunables.tp"),
    ("search_space.tunables", {"mbs": [1.5]}, "search_space.tunables.mbs"),
    ("search_space.tunables", {"mbs": list(range(1, 5000))}, "search_space.tunables.mbs"),
    ("search_space.tunables", {"tp": [1, 2**60]}, "search_space.tunables.tp"),
    ("search_space.tunables", {"tp": [1, 2], "TP": [1]}, "search_space.tunables.TP"),
    ("search_space.tunables", {"tp": [1, 2, 4, 8], "pp": list(range(1, 33)), "mbs": list(range(1, 257)),
                               "sp": [False, True], "cp": [1, 2, 4, 8], "vpp": list(range(1, 9))},
     "search_space.tunables"),  # 2,097,152 combinations
    ("search_space.tunables", ["tp"] * 100, "search_space.tunables"),
    ("search_space.tunables", "tp, pp", "search_space.tunables"),
    ("search_space.fixed", {"sp": "yes"}, "search_space.fixed.sp"),
    ("search_space.fixed", {"mbs": -1}, "search_space.fixed.mbs"),
    ("search_space.fixed", {"tp": 2}, "search_space"),  # tp is tunable too
    ("baseline", {"tp": True}, "baseline.tp"),
    ("baseline", {"tp": 3, "pp": 1, "mbs": 1}, "baseline.tensor_model_parallel_size"),
    ("baseline", "tp2", "baseline"),
    ("name", "n" * 300, "name"),
    ("name", "\x1b]0;owned\x07\x1b[31mred", "name"),
    ("name", "right-to-left \u202e gpj.exe", "name"),
    ("name", "mark \u200f\u061c\u200e reorders", "name"),  # bidi marks
    ("name", "invisible\u200b\u2060\ufeff\u00ad\U000e0001", "name"),  # zero-width, soft hyphen, tag
    ("launcher", {"env": {"X": "\x1b[31m"}}, "launcher.env.X"),
    ("name", 123, "name"),
    ("name", "", "name"),
    ("name", "   ", "name"),
    ("name", "\u3164\u2800\u3000", "name"),  # Hangul filler, braille blank, ideographic space: shows nothing
    ("name", "\u034f\u17b4\ufe0f\u0301", "name"),  # a grapheme joiner, a Khmer vowel, a variation selector, a mark
    ("seed", -1, "seed"),
    ("seed", 2**40, "seed"),
    ("seed", "1", "seed"),
    ("budget", {"max_trials": 10**9}, "budget.max_trials"),
    ("budget", {"max_trials": True}, "budget.max_trials"),
    ("budget", {"gpu_hours": -1}, "budget.gpu_hours"),
    ("budget", {"target_mfu": "high"}, "budget.target_mfu"),
    ("launcher", {"kind": "../../bin/sh"}, "launcher.kind"),
    ("launcher", {"framework_version": "r1\x1b[2J"}, "launcher.framework_version"),
    ("launcher", {"pass_env": ["A=B"]}, "launcher.pass_env"),
    ("launcher", {"pass_env": [f"V{i}" for i in range(600)]}, "launcher.pass_env"),
    ("launcher", {"timeout_s": 1e300}, "launcher.timeout_s"),
    ("launcher", {"env": {"A=B": "x"}}, "launcher.env"),
    # *** under a secret name is filled from the worker's variable at launch: never from OptiCo's own.
    ("launcher", {"env": {"OPTICO_LLM_API_KEY": "***"}}, "launcher.env.OPTICO_LLM_API_KEY"),
    ("launcher", {"env": {"OPENAI_API_KEY": "***"}}, "launcher.env.OPENAI_API_KEY"),
    ("launcher", {"pass_env": ["OPENAI_API_KEY"]}, "launcher.pass_env"),
    ("launcher", {"env": {"openai_api_key": "***"}}, "launcher.env.openai_api_key"),  # settings ignore case
    ("launcher", {"pass_env": ["optico_llm_api_key"]}, "launcher.pass_env"),
    ("launcher", {"env": {"PATH": 1}}, "launcher.env.PATH"),
    ("launcher", {"env": {f"V{i}": "x" for i in range(600)}}, "launcher.env"),
    ("launcher", {"program": {"kind": "nemo"}}, "launcher.program"),
    ("launcher", {"kind": "local", "program": {"kind": "megatron-lm"}}, "launcher.program"),
    ("launcher", {"max_infra_retries": 10**6}, "launcher.max_infra_retries"),
    # What each trial runs: its steps, time and seed are bounded like the launcher's own (the bad value
    # first: a case's id is the value's first characters).
    ("launcher", {"program": {"max_time_s": 1e300, "kind": "megatron-core"}, "kind": "local"},
     "launcher.program.max_time_s"),
    ("launcher", {"program": {"seed": -9 * 10**18, "kind": "megatron-core"}, "kind": "local"}, "launcher.program.seed"),
    ("launcher", {"program": {"max_steps": 9 * 10**18, "kind": "megatron-core"}, "kind": "local"},
     "launcher.program.max_steps"),
    ("launcher", {"program": {"cv_target": 1e300, "kind": "megatron-core"}, "kind": "local"},
     "launcher.program.cv_target"),
    ("launcher", {"program": {"python": "/tmp/evil\x1b[31m", "kind": "megatron-core"}, "kind": "local"},
     "launcher.program.python"),
    ("launcher", {"program": {"train_iters": 10**12, "kind": "megatron-lm", "command": ["pretrain_gpt.py"]},
                  "kind": "local"}, "launcher.program.train_iters"),
    ("reasoner", "magic", "reasoner.analysis"),
    ("reasoner", {"analysis": [1]}, "reasoner.analysis"),
    ("calibration", 12, "calibration"),
    ("colour", "blue", "colour"),
]

# An all-invalid space of 196,608 combinations (param-gather overlap without the distributed optimizer):
# refused after the bounded feasibility probe, not after enumerating it all.
ALL_INVALID = edit(edit(GOOD, "search_space.fixed", {"use_distributed_optimizer": False,
                                                     "overlap_param_gather": True}),
                   "search_space.tunables", {
                       "tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "cp": [1, 2], "mbs": [1, 2, 4, 8], "vpp": [1, 2, 4, 8],
                       "sp": [False, True], "recompute": ["none", "selective", "full"],
                       "overlap_grad_reduce": [False, True], "cross_entropy_loss_fusion": [False, True],
                       "tp_comm_overlap": [False, True], "decoder_first_pipeline_num_layers": [None, 1, 2, 3]})

# -- files a spec names --------------------------------------------------------------------------------
CALIBRATION = {"gemm_efficiency": 0.8}
FILE_CASES = [
    Case("replay CSV is /etc/passwd", edit(REPLAY, "launcher.data", "/etc/passwd"), "launcher.data"),
    Case("replay CSV is binary", REPLAY, "launcher.data", {"runs.csv": b"model,tp\n\x00\x01\x02\xff" * 100}),
    Case("replay CSV not UTF-8", REPLAY, "launcher.data", {"runs.csv": PAPER_CSV.replace("Llama3-8B", "Llam\xe4")
                                                          .encode("latin-1", "replace")}),
    # (One unreadable cell is not hostile: the tolerant reader skips or infers that row and names it —
    # issue 16. A file that is not a replay table at all still is, below.)
    Case("replay CSV of 9 MB", REPLAY, "launcher.data", {"runs.csv": PAPER_CSV.encode() + b"#" * 9_000_000}),
    Case("replay CSV is /dev/zero", edit(REPLAY, "launcher.data", "/dev/zero"), "launcher.data"),
    Case("replay CSV is a directory", edit(REPLAY, "launcher.data", "/tmp"), "launcher.data"),
    Case("replay CSV missing", edit(REPLAY, "launcher.data", "nowhere.csv"), "launcher.data"),
    Case("replay CSV at 400000% MFU", REPLAY, "launcher.data", {"runs.csv": csv_with({"mfu": "4000"})}),
    Case("replay CSV at 500 GiB on an 80 GB GPU", REPLAY, "launcher.data",
         {"runs.csv": csv_with({"mem_max_gib": "500"})}),
    # The MFU comes from the step time when there is one; a stated MFU or TFLOP/s past the peak is still
    # no measurement.
    Case("replay CSV stating 150 % MFU beside a step time", REPLAY, "launcher.data",
         {"runs.csv": csv_with({"mfu": "1.5", "step_time_s": "60"})}),
    Case("replay CSV stating 1e300 TFLOP/s", REPLAY, "launcher.data",
         {"runs.csv": csv_with({"tflops_per_gpu": "1e300", "step_time_s": "60"})}),
    Case("replay CSV with a negative TFLOP/s", REPLAY, "launcher.data",
         {"runs.csv": csv_with({"tflops_per_gpu": "-5", "mfu": ""})}),
    Case("replay CSV with only a header", REPLAY, "launcher.data", {"runs.csv": PAPER_CSV.split("\n")[0].encode()}),
    # A wrong row among good ones: the tolerant reading would skip it; a spec's own file is broken.
    Case("replay CSV with a negative batch", REPLAY, "launcher.data", {"runs.csv": csv_with({"gbs": "-16"})}),
    Case("replay CSV with a result that is none", REPLAY, "launcher.data", {"runs.csv": csv_with({"result": "garbage"})}),
    Case("replay CSV with a row cut short", REPLAY, "launcher.data",
         {"runs.csv": PAPER_CSV.encode() + b'Llama3-8B,32,4096,oops,"unterminated\n'}),
    Case("replay CSV with a row shifted by a comma", REPLAY, "launcher.data",
         {"runs.csv": (PAPER_CSV.rstrip("\n") + "\n" + PAPER_CSV.splitlines()[1] + ",one,two\n").encode()}),
    Case("replay CSV with a 200 KB cell", REPLAY, "launcher.data",
         {"runs.csv": csv_with({"notes": "n" * 200_000})}),
    Case("replay CSV with an unclosed quote", REPLAY, "launcher.data",
         {"runs.csv": PAPER_CSV.encode() + b'"unclosed,' + b"x" * 200_000}),
    Case("replay CSV of 240,000 empty rows", REPLAY, "launcher.data", {"runs.csv": (
        PAPER_CSV.split("\n")[0] + "\n" + ("," * 25 + "ok" + "," * 6 + "\n") * 240_000).encode()}),
    Case("replay CSV of another workload", edit(REPLAY, "workload.seq_length", 4096), "launcher.data",
         {"runs.csv": PAPER_CSV.encode()}),
    Case("replay launcher without data", edit(REPLAY, "launcher.data", ...), "launcher.data"),
    Case("replay data is a number", edit(REPLAY, "launcher.data", 42), "launcher.data"),
    Case("calibration is /etc/passwd", edit(GOOD, "calibration", "/etc/passwd"), "calibration"),
    Case("calibration is a JSON list", edit(GOOD, "calibration", "c.json"), "calibration", {"c.json": b"[1, 2]"}),
    Case("calibration with NaN", edit(GOOD, "calibration", "c.json"), "calibration",
         {"c.json": b'{"gemm_efficiency": NaN}'}),
    Case("calibration nested 100000 deep", edit(GOOD, "calibration", "c.json"), "calibration",
         {"c.json": b"[" * 100_000 + b"]" * 100_000}),
    Case("calibration with an unknown constant", edit(GOOD, "calibration", "c.json"), "calibration.warp",
         {"c.json": json.dumps({**CALIBRATION, "warp": 9}).encode()}),
    Case("calibration with a boolean", edit(GOOD, "calibration", "c.json"), "calibration.gemm_efficiency",
         {"c.json": b'{"gemm_efficiency": true}'}),
    Case("calibration out of bounds", edit(GOOD, "calibration", "c.json"), "calibration.gemm_efficiency",
         {"c.json": b'{"gemm_efficiency": 40}'}),
    Case("calibration of 5 MB", edit(GOOD, "calibration", "c.json"), "calibration",
         {"c.json": b'{"gemm_efficiency": 0.8' + b" " * 5_000_000 + b"}"}),
]

# -- what this machine cannot run ----------------------------------------------------------------------
MACHINE_CASES = [
    Case("local launcher, GPUs this machine lacks", edit(edit(GOOD, "launcher", {"kind": "local"}),
                                                         "workload.cluster.gpus_per_node", 8), "workload.cluster.gpu"),
    Case("local launcher across two nodes", edit(edit(GOOD, "launcher", {"kind": "local"}),
                                                 "workload.cluster.nodes", 2), "launcher.kind"),
    Case("run_dir under a file", edit(GOOD, "launcher", {"kind": "local", "run_dir": "/etc/hostname/runs"}),
         "launcher.run_dir"),
    Case("run_dir in an unknown user's home", edit(TINY_CPU, "launcher", {"kind": "local",
                                                                          "run_dir": "~no-such-user-x/runs"}),
         "launcher.run_dir"),
    Case("ray_init with an unknown keyword", edit(TINY_CPU, "launcher", {"kind": "ray", "address": "local",
                                                                        "ray_init": {"num_gpus": 2, "gpus": 2}}),
         "launcher.ray_init.gpus"),
    Case("ray local cluster with too few logical GPUs",
         edit(TINY_CPU, "launcher", {"kind": "ray", "address": "local", "ray_init": {"num_gpus": 1}}),
         "launcher.ray_init.num_gpus"),
]


def all_cases() -> list[Case]:
    cases = list(TEXT_CASES)
    for dotted, value, expect in FIELD_CASES:
        label = f"{dotted}={str(value)[:30]!r}" if value is not ... else f"{dotted} missing"
        cases.append(Case(label, edit(GOOD, dotted, value), expect))
    cases.append(Case("all-invalid space of 196,608", ALL_INVALID, "search_space"))
    cases += FILE_CASES + MACHINE_CASES
    return cases


CASES = all_cases()

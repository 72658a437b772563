"""Sweep what one GPU can tune for a ~1B Llama-style model and record every run as replay rows.

Runs the megatron-core benchmark driver (optico.launchers.megatron.bench) once per
configuration — micro-batch size, recompute none/selective/full, cross-entropy fusion, the
distributed optimizer — each in its own torchrun process, OOMs included, and writes the rows
in the replay CSV format of DESIGN.md with the exact command and the framework fingerprint.

    python benchmarks/gpu_sweep.py --out benchmarks/data/h100-llama-1b.csv [--quick]
    python benchmarks/gpu_sweep.py --spec examples/llama3.2-3b-h100-1gpu.yaml --out FILE.csv \
        --config mbs=1 --config mbs=2,recompute=full,recompute_method=block,recompute_num_layers=14

A run cut by `--timeout` before it reported a result or a failure is no measurement of its
configuration (the limit may just be short for the machine): its row goes to OUT's sibling
`<name>.timed-out.csv`, not into the landscape.

`--quick` runs three tiny configurations on whatever device is there (a smoke test). `--spec`
takes the workload of an OptiCo spec (its GPU replaced by the one present) and sweeps the
configurations given with `--config` (field=value pairs, the spec's `fixed` fields underneath).
OPTICO_BENCH_FUSE_ROPE=1 in the environment reaches the driver; each row's notes name the
driver's patches (`shim`).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from optico.gpus import normalize_gpu_name  # noqa: E402
from optico.launchers.megatron import report  # noqa: E402
from optico.launchers.proc import ProcessRun  # noqa: E402
from optico.launchers.megatron.bench import torchrun_command, write_spec  # noqa: E402
from optico.replay_format import COLUMNS  # noqa: E402
from optico.replay_rows import replay_row  # noqa: E402
from optico.safe_yaml import load_yaml  # noqa: E402
from optico.spec import load_spec  # noqa: E402
from optico.strategy import Strategy, strategy_from_mapping  # noqa: E402
from optico.workload import PRESETS, Cluster, ModelArch, Workload  # noqa: E402

LLAMA_1B = ModelArch(name="llama-1b", num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=4,
                     ffn_hidden_size=5632, vocab_size=32000)


def gpu_key() -> str:
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "h100-sxm"
    key = normalize_gpu_name(name)
    return {"h100-80gb-hbm3": "h100-sxm", "h200": "h200"}.get(key, key if key in ("h100-sxm", "h200") else "h100-sxm")


def configurations(quick: bool) -> list[Strategy]:
    if quick:
        return [strategy_from_mapping(d) for d in ({"mbs": 1}, {"mbs": 2, "recompute": "full"},
                                                   {"mbs": 1, "cross_entropy_loss_fusion": True})]
    out = []
    base = {"distributed_optimizer": True, "cross_entropy_loss_fusion": True}
    for mbs in (1, 2, 4, 8):
        for recompute in ("none", "selective", "full"):
            out.append({**base, "mbs": mbs, "recompute": recompute})
    for mbs in (1, 2, 4, 8):
        out.append({**base, "mbs": mbs, "cross_entropy_loss_fusion": False})
        out.append({**base, "mbs": mbs, "distributed_optimizer": False})
    out.append({**base, "mbs": 16, "recompute": "none"})
    out.append({**base, "mbs": 16, "recompute": "full"})
    return [strategy_from_mapping(d) for d in out]


def parse_config(text: str, fixed: dict) -> Strategy:
    """`mbs=2,recompute=full` (values read as YAML scalars) over the spec's fixed fields."""
    pairs = dict(item.split("=", 1) for item in text.split(",") if item)
    return strategy_from_mapping({**fixed, **{k.strip(): load_yaml(v) for k, v in pairs.items()}})


async def run_whole(cmd: list[str], run_dir: Path, timeout_s: float,
                    env: dict[str, str] | None = None) -> tuple[str, bool, int | None]:
    """Run one torchrun tree; on timeout kill all of it, workers included (torchrun starts them in
    sessions of their own), so that the next run starts on an empty GPU.
    Returns (stdout + stderr, timed out, exit status)."""
    lines: list[str] = []
    run = ProcessRun(cmd, env={**(env or os.environ), "PYTHONUNBUFFERED": "1"}, cwd=str(REPO), run_dir=run_dir,
                     token=uuid.uuid4().hex, sink=lambda _stream, line: lines.append(line))
    await run.start()
    timed_out = await run.wait(timeout=timeout_s) is None
    code = await run.kill(grace_s=5.0)  # also reaps a worker left behind by a torchrun that exited
    return "\n".join(lines), timed_out, code


def cut_short(parsed: dict, timed_out: bool) -> bool:
    """The limit killed the run before it reported a result or a failure: no measurement. A run that
    printed its result or its OOM and then hung on its way out was measured."""
    return timed_out and not parsed.get("result") and report.primary_error(parsed.get("errors", [])) is None


class RowFile:
    """A replay CSV written row by row, so that an interrupted sweep keeps what it measured; created at
    its first row unless `always`."""

    def __init__(self, path: Path, *, always: bool = False):
        self.path, self.count, self._file, self._writer = path, 0, None, None
        if always:
            self._open()

    def _open(self) -> None:
        self._file = self.path.open("w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=list(COLUMNS))
        self._writer.writeheader()

    def write(self, r: dict) -> None:
        if self._writer is None:
            self._open()
        self._writer.writerow(r)
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def row(w: Workload, s: Strategy, parsed: dict, command: str, timed_out_s: float | None = None) -> dict:
    """The run as a replay row (optico.replay_rows: it reads back as this workload and strategy)."""
    res = parsed.get("result")
    notes: dict = {"command": command, "cross_entropy_loss_fusion": s.cross_entropy_loss_fusion}
    source = "OptiCo gpu_sweep.py (megatron-core benchmark driver, this repository)"
    if res and res.get("ok"):
        notes.update({k: res.get(k) for k in ("mem_max_reserved_gib", "gpu_util_avg", "cv", "steps", "stop_reason",
                                              "layer_spec", "shim", "fingerprint")})
        metrics = {**res, "mem_max_gib": res.get("mem_max_allocated_gib")}  # null MFU/TFLOP/s on CPU
        return replay_row(w, s, result="ok", source=source, notes=notes, metrics=metrics,
                          memory_meaning="mem_max_gib = torch max allocated (all ranks)")
    err = report.primary_error(parsed.get("errors", []))
    notes["error"] = (f"timed out after {timed_out_s:g} s" if timed_out_s and not err
                      else (err or {}).get("message", "no result line")[:300])
    result = "oom" if (err or {}).get("category") == "oom" else "error"
    return replay_row(w, s, result=result, source=source, notes=notes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="CSV to write (replay format).")
    ap.add_argument("--quick", action="store_true", help="Three tiny configurations: a smoke test.")
    ap.add_argument("--gbs", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--only", type=int, nargs="*", help="Run only these configuration numbers (1-based).")
    ap.add_argument("--spec", help="Take the workload and step limits from this OptiCo spec (needs --config).")
    ap.add_argument("--config", action="append", default=[], help="A configuration as field=value,... (repeat).")
    args = ap.parse_args()
    warmup, max_steps, min_steps = 2, args.max_steps, 3
    configs = configurations(args.quick)
    if args.spec:
        job = load_spec(args.spec)
        program = job.launcher.program
        if not args.config or program is None or program.kind != "megatron-core":
            ap.error("--spec needs a megatron-core program in its launcher and at least one --config")
        w = job.workload.model_copy(update={"cluster": job.workload.cluster.model_copy(update={"gpu": gpu_key()})})
        try:
            configs = [parse_config(c, dict(job.search_space.fixed)) for c in args.config]
        except (ValueError, KeyError) as exc:  # a pair without '=', an unknown field or value
            ap.error(f"--config: {str(exc).strip(chr(34)).splitlines()[0][:200]}")
        warmup, max_steps, min_steps = program.warmup, program.max_steps, program.min_steps
    elif args.quick:
        w = Workload(model=PRESETS["tiny-gpt"], seq_length=64, global_batch_size=4,
                     cluster=Cluster(gpu=gpu_key(), gpus_per_node=1))
    else:
        w = Workload(model=LLAMA_1B, seq_length=args.seq, global_batch_size=args.gbs, precision="bf16",
                     cluster=Cluster(gpu=gpu_key(), gpus_per_node=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    measured = RowFile(out, always=True)
    cut = RowFile(out.with_name(f"{out.stem}.timed-out.csv"))
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(configs):
            if args.only and i + 1 not in args.only:
                continue
            spec_path = write_spec(Path(tmp) / f"spec{i}.json", w, s, warmup=warmup, max_steps=max_steps,
                                   min_steps=min_steps)
            cmd = torchrun_command(spec_path, 1)
            shown = " ".join(["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m",
                              "optico.launchers.megatron.bench", "--spec-json", f"<{s.short()}>"])
            t0 = time.time()
            text, timed_out, _ = asyncio.run(run_whole(cmd, Path(tmp) / f"run{i}", args.timeout))
            parsed = report.parse_output(text)
            r = row(w, s, parsed, shown, timed_out_s=args.timeout if timed_out else None)
            (cut if cut_short(parsed, timed_out) else measured).write(r)
            print(f"{i + 1:2d} {s.short():44s} {r['result']:5s} mfu {r['mfu'] or '-':>7} "
                  f"mem {r['mem_max_gib'] or '-':>7}  {time.time() - t0:5.1f}s", flush=True)
    measured.close()
    cut.close()
    print(f"wrote {measured.count} rows to {out}")
    if cut.count:
        print(f"{cut.count} run(s) cut by the {args.timeout:g} s limit, not measured: {cut.path} "
              f"(run them again with a longer --timeout)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

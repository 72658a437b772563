"""Profile a few steps of one configuration of the ~1B model: where the step time goes.

    python benchmarks/gpu_profile.py --mbs 4 --recompute none --out profile.json

Runs the benchmark driver with OPTICO_BENCH_PROFILE set (optico/launchers/megatron/profile.py):
after timing, three more steps run under torch.profiler and the kernels are grouped into GEMM,
attention, communication, memory-bound and idle shares of the step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_sweep import LLAMA_1B, gpu_key, run_whole  # noqa: E402

from optico.launchers.megatron.bench import torchrun_command, write_spec  # noqa: E402
from optico.strategy import strategy_from_mapping  # noqa: E402
from optico.workload import Cluster, Workload  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--recompute", default="none")
    ap.add_argument("--no-ce-fusion", action="store_true")
    ap.add_argument("--gbs", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    w = Workload(model=LLAMA_1B, seq_length=args.seq, global_batch_size=args.gbs, precision="bf16",
                 cluster=Cluster(gpu=gpu_key(), gpus_per_node=1))
    s = strategy_from_mapping({"mbs": args.mbs, "recompute": args.recompute, "distributed_optimizer": True,
                               "cross_entropy_loss_fusion": not args.no_ce_fusion})
    with tempfile.TemporaryDirectory() as tmp:
        spec = write_spec(Path(tmp) / "spec.json", w, s, warmup=2, max_steps=6, min_steps=3)
        env = {**os.environ, "OPTICO_BENCH_PROFILE": str(Path(args.out).resolve())}  # run_whole adds unbuffered
        text, timed_out, code = asyncio.run(run_whole(torchrun_command(spec, 1), Path(tmp) / "run", 300, env))
    print("\n".join(line for line in text.splitlines()
                    if line.startswith(("OPTICO_RESULT", "OPTICO_ERROR")) or "Error" in line)[-6000:])
    if timed_out:
        print("timed out after 300 s: the run and its workers were killed")
        return 1
    return code or 0


if __name__ == "__main__":
    sys.exit(main())

"""A stand-in for Megatron-LM's pretrain_gpt.py, run under torchrun by the launcher tests.

It parses the flags Megatron-LM's argument parser would (allow_abbrev=False; an unknown flag
is an error, as in Megatron-LM), applies a few of validate_args' checks, and prints what
Megatron-LM prints: the arguments banner on rank 0, the iteration line on the last rank
(`--log-throughput` adds the throughput field), the memory line on ranks of data-parallel
rank 0 after the first iteration. Times are fixed numbers derived from the flags, so a test
knows the metrics to expect. It runs out of memory, with the text and traceback of a real
CUDA OOM, when the micro-batch is at least --fake-oom-mbs and nothing is recomputed.

Fault flags (tests only): --fake-hang-after N (go silent after N iterations),
--fake-forever (keep printing, never finish), --fake-ignore-sigterm, --fake-spawn-orphan
(start a `sleep` in a session of its own: a process that escapes torchrun's process tree),
--fake-record DIR (write this rank's argv to DIR/argv-rank<R>.json), --fake-port-taken-once FILE
(the first run, which creates FILE, fails as torchrun does when its master port is already bound).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"  # printed as torch.OutOfMemoryError, as the real one


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    for name in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--max-position-embeddings",
                 "--micro-batch-size", "--global-batch-size", "--train-iters", "--train-samples", "--log-interval",
                 "--eval-iters", "--eval-interval", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--context-parallel-size", "--expert-model-parallel-size", "--num-virtual-stages-per-pipeline-rank",
                 "--recompute-num-layers", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--fake-oom-mbs", "--fake-hang-after"):
        p.add_argument(name, type=int, default=None)
    for name in ("--data-path", "--tokenizer-type", "--vocab-file", "--merge-file", "--save", "--load", "--lr",
                 "--recompute-granularity", "--recompute-method", "--moe-token-dispatcher-type", "--split",
                 "--fake-record", "--fake-port-taken-once"):
        p.add_argument(name, default=None)
    for name in ("--bf16", "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--log-throughput", "--cross-entropy-loss-fusion", "--tp-comm-overlap",
                 "--moe-grouped-gemm", "--no-overlap-p2p-communication", "--fake-forever", "--fake-ignore-sigterm",
                 "--fake-spawn-orphan", "--fake-print-env"):
        p.add_argument(name, action="store_true")
    return p


def stamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")


def train_step_that_runs_out_of_memory(mbs: int) -> None:
    free = 0.31
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {2.0 * mbs:.2f} GiB. GPU 0 has a total capacity of 79.10 GiB of "
        f"which {free:.2f} GiB is free. Including non-PyTorch memory, this process has 78.78 GiB memory in use. "
        "Of the allocated memory 76.12 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but "
        "unallocated.")


def main() -> int:
    args = parser().parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.fake_record:
        with open(os.path.join(args.fake_record, f"argv-rank{rank}.json"), "w") as fh:
            json.dump(sys.argv[1:], fh)
        with open(os.path.join(args.fake_record, f"env-rank{rank}.json"), "w") as fh:
            json.dump(dict(os.environ), fh)
    if args.fake_port_taken_once and not os.path.exists(args.fake_port_taken_once):
        open(args.fake_port_taken_once, "w").close()
        # torchrun's own words when the rendezvous store cannot bind (torch 2.x, static rendezvous)
        print("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
              f"address. port: {os.environ.get('MASTER_PORT')}, useIpv6: false, code: -98, name: EADDRINUSE, "
              "message: address already in use", file=sys.stderr, flush=True)
        return 1
    if args.fake_print_env and rank == 0:  # a careless training script that logs its environment
        for key, value in sorted(os.environ.items()):
            print(f"{key}={value}", flush=True)
    if args.fake_spawn_orphan and rank == 0:
        subprocess.Popen(["sleep", "300"], start_new_session=True)
    tp, pp = args.tensor_model_parallel_size or 1, args.pipeline_model_parallel_size or 1
    mbs, gbs = args.micro_batch_size or 1, args.global_batch_size or 1
    # validate_args, in part
    assert world % (tp * pp) == 0, (f"world size ({world}) is not divisible by tensor model parallel size ({tp}) "
                                    f"times pipeline model parallel size ({pp})")
    dp = world // (tp * pp)
    assert gbs % (mbs * dp) == 0, "global batch size should be divisible by micro batch size times data parallel size"
    if args.train_iters and args.train_samples:
        raise AssertionError("expected iteration-based training")
    if rank == 0:
        print("------------------------ arguments ------------------------", flush=True)
        for key, value in sorted(vars(args).items()):
            print(f"  {key} {'.' * (48 - len(key))} {value}", flush=True)
        print("-------------------- end of arguments ---------------------", flush=True)
    iters = args.train_iters or (args.train_samples // gbs if args.train_samples else 10)
    interval = args.log_interval or 100
    oom = args.fake_oom_mbs is not None and mbs >= args.fake_oom_mbs and args.recompute_granularity is None
    last = rank == world - 1
    consumed = 0
    for it in range(1, iters + 1):
        if oom and rank == 0:
            train_step_that_runs_out_of_memory(mbs)
        if args.fake_hang_after is not None and it > args.fake_hang_after:
            time.sleep(3600)
        time.sleep(0.05)
        consumed += gbs
        # the first iteration is slow (warm-up); then a fixed time the test can predict
        elapsed_ms = 900.0 if it == 1 else 100.0 + 10.0 * tp + 5.0 * pp + (7.0 if args.recompute_granularity else 0)
        tflops = 50.0 if it == 1 else 400.0 / (1 + 0.1 * tp)
        if last and it % interval == 0:
            # Megatron-LM's training_log(): each field written as ' name: value |'
            line = f" [{stamp()}]" + f" iteration {it:8d}/{iters:8d} |" + f" consumed samples: {consumed:12d} |"
            line += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
            if args.log_throughput:
                line += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
            line += f" learning rate: {1e-4:.6E} |" + f" global batch size: {gbs:5d} |"
            line += f" lm loss: {10.5 - 0.1 * it:.6E} |" + f" loss scale: {1.0:.1f} |" + f" grad norm: {2.5:.3f} |"
            line += f" num zeros: {0.0:.1f} |"  # an optional field some versions print
            line += f" number of skipped iterations: {0:3d} |" + f" number of nan iterations: {0:3d} |"
            print(line, flush=True)
        if it == interval and (rank // tp) % dp == 0:  # data-parallel rank 0 (order tp-dp-pp)
            alloc = 1000.0 + 100.0 * mbs + rank
            print(f"[Rank {rank}] (after {it} iterations) memory (MB) | allocated: {alloc:.1f} | max allocated: "
                  f"{alloc + 500:.1f} | reserved: {alloc + 1000:.1f} | max reserved: {alloc + 1000:.1f}", flush=True)
    while args.fake_forever:
        print(f"still training ({stamp()})", flush=True)
        time.sleep(0.3)
    return 0


if __name__ == "__main__":
    sys.exit(main())

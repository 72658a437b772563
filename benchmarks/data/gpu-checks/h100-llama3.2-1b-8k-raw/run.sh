#!/bin/bash
# The device command of 2026-11-27 (one H100, no network): the same steps as the script that ran, which read
# its configurations and the probe spec from .whl/ instead of this folder. Run from the repository root with the
# carried wheels in .whl/ (docs/benchmarks.md, "How to run it"). CONFIGS picks the pass:
#   first pass:  CONFIGS=configs-first-pass.txt  SWEEP_S=440 RUN_S=75 bash run.sh   (then the probe)
#   second pass: PROBE=0 CONFIGS=configs-second-pass.txt SWEEP_S=230 RUN_S=70 bash run.sh   (no probe)
#   repeat:      CONFIGS=configs-repeat.txt      SWEEP_S=150 RUN_S=70 bash run.sh   (then the probe)
# Rows are written one by one into $OUT, so a pass cut off by SWEEP_S keeps what it measured.
HERE=benchmarks/data/gpu-checks/h100-llama3.2-1b-8k-raw
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
args=(); while read -r c; do args+=(--config "$c"); done < "$HERE/${CONFIGS:-configs-first-pass.txt}"
timeout "${SWEEP_S:-440}" python3 benchmarks/gpu_sweep.py --spec examples/llama3.2-1b-h100-1gpu-8k.yaml \
    --out "$OUT/h100-llama3.2-1b-8k.csv" --timeout "${RUN_S:-75}" "${args[@]}" 2>&1 | tee "$OUT/sweep.log"
if [ "${PROBE:-1}" = 1 ]; then
  pkill -9 -f optico.launchers.megatron.bench; sleep 2  # a run cut off by timeout must not hold the GPU
  timeout 80 python3 benchmarks/gpu_sweep.py --spec "$HERE/llama3-8b-8-layers-probe.yaml" \
      --out "$OUT/probe-l8.csv" --timeout 75 --config mbs=1,cross_entropy_loss_fusion=true 2>&1 | tee -a "$OUT/probe.log"
fi

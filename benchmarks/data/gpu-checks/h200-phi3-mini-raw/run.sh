#!/bin/bash
# The device command of 2026-11-27 (one H200, no network). Run from the repository root with the carried
# wheels in .whl/ (docs/benchmarks.md, "How to run it"): SWEEP_S=530 RUN_S=90 bash run.sh
# The configurations are in configs.txt, in the order they ran; rows are written one by one into $OUT,
# so a sweep cut off by SWEEP_S keeps what it measured. The first pass (first-pass.csv, .log) measured
# the first 11; the second (second-pass.csv, .log), on the same warm machine, ran the last five lines of
# configs.txt with the same wheels and environment:
#   python3 benchmarks/gpu_sweep.py --spec examples/phi3-mini-h200-1gpu.yaml --out second-pass.csv \
#       --timeout 90 --config ...   # each of: tail -n 5 configs.txt, under `timeout 225`
HERE=benchmarks/data/gpu-checks/h200-phi3-mini-raw
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, megatron.core; print('torch', torch.__version__, 'megatron-core', megatron.core.__version__)" | tee -a "$OUT/gpu.txt"
args=(); while read -r c; do args+=(--config "$c"); done < "$HERE/configs.txt"
timeout "${SWEEP_S:-530}" python3 benchmarks/gpu_sweep.py --spec examples/phi3-mini-h200-1gpu.yaml \
    --out "$OUT/h200-phi3-mini.csv" --timeout "${RUN_S:-90}" "${args[@]}" 2>&1 | tee "$OUT/sweep.log"

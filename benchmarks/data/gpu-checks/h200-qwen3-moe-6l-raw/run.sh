#!/bin/bash
# The device command of 2026-11-29 (one H200, no network). Run from the repository root with the carried
# wheels in .whl/ (docs/benchmarks.md, "How to run it"): SWEEP_S=540 RUN_S=100 bash run.sh
# configs.txt holds the configurations in the order they run; rows are written one by one into $OUT, so a
# sweep cut off by SWEEP_S keeps what it measured. The first configuration runs alone: if it does not
# even run (an error, not an OOM), megatron-core's MoE path is broken on this machine, and the rest of
# the time goes to a live `optico tune` of the Phi-3-mini H200 workload instead.
# It ran the first seven lines (first.csv/.log, rest.csv/.log; 540 s in all, wheels included). A second call
# on the same warm machine, 200 s, ran lines 8-12 with a per-run limit of 60 s (second-pass.csv/.log); it
# measured three (lines 8, 9, 11), the call's 190 s ran out during line 12, and the 60 s limit cut line 10
# (MBS 1 with allgather), which is no measurement of that configuration (MBS 1 with alltoall had taken
# 102 s), so that row is not in the landscape:
#   H=benchmarks/data/gpu-checks/h200-qwen3-moe-6l-raw; args=(); while read -r c; do args+=(--config "$c"); done \
#       < <(sed -n 8,12p $H/configs.txt); timeout 190 python3 benchmarks/gpu_sweep.py \
#       --spec examples/qwen3-moe-6l-h200-1gpu.yaml --out second-pass.csv --timeout 60 "${args[@]}"
# benchmarks/data/h200-qwen3-moe-6l.csv is the rows of the three files, less that one.
HERE=benchmarks/data/gpu-checks/h200-qwen3-moe-6l-raw
SPEC=examples/qwen3-moe-6l-h200-1gpu.yaml
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, megatron.core; print('torch', torch.__version__, 'megatron-core', megatron.core.__version__)" 2>/dev/null | tee -a "$OUT/gpu.txt"
timeout 200 python3 benchmarks/gpu_sweep.py --spec $SPEC --out "$OUT/first.csv" --timeout "${RUN_S:-100}" \
    --config "$(head -n 1 $HERE/configs.txt)" 2>&1 | tee "$OUT/first.log"
first=$(python3 -c "import csv,sys; print(next(csv.DictReader(open(sys.argv[1])))['result'])" "$OUT/first.csv" 2>/dev/null)
left=$(( ${SWEEP_S:-540} - ($(date +%s) - START) ))
echo "first configuration: ${first:-no row}; ${left} s left"
if [ "$left" -lt 60 ]; then
    echo "too little time left for the rest"
elif [ "$first" = ok ] || [ "$first" = oom ]; then
    args=(); while read -r c; do args+=(--config "$c"); done < <(tail -n +2 "$HERE/configs.txt")
    timeout "$left" python3 benchmarks/gpu_sweep.py --spec $SPEC --out "$OUT/rest.csv" \
        --timeout "${RUN_S:-100}" "${args[@]}" 2>&1 | tee "$OUT/rest.log"
else
    timeout "$left" python3 -m optico.cli tune examples/phi3-mini-h200-1gpu.yaml --launcher local \
        --json "$OUT/h200-phi3-mini-tune.json" 2>&1 | tee "$OUT/tune.log"
fi
echo "done in $(( $(date +%s) - START )) s"

#!/usr/bin/env bash
# Benchmarks 1, 2 and 7 on one GPU, in one go (a few minutes on an H100/H200):
#   bash benchmarks/gpu.sh            # tables on stdout, and in $OUT/ (default: benchmarks/results-gpu/)
# Benchmark 1: STAPOTrainer vs GRPOTrainer on a randomly initialised Qwen3-0.6B-shaped model in bf16.
# Benchmark 2: the S2T work alone at 8 x 20,480 and 64 x 4,096 tokens.
# Benchmark 7: what the Table 1 metrics (spurious_mechanism_metrics) add to a step, on the same model shape.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out="${OUT:-benchmarks/results-gpu}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python benchmarks/mask_cost.py --device cuda | tee "$out/mask_cost.md"
python benchmarks/step_overhead.py --preset qwen3-0.6b --device cuda --dtype bfloat16 --rounds 10 \
    | tee "$out/step_overhead_qwen3-0.6b.md"
python benchmarks/mechanism_cost.py --sizes qwen3-0.6b --device cuda --dtype bfloat16 --prompt-length 128 \
    --completion-length 1024 --rounds 30 | tee "$out/mechanism_cost_qwen3-0.6b.md"

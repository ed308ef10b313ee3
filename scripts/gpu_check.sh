#!/usr/bin/env bash
# The GPU check: one prepared run for a lent GPU machine (one GPU, ~16 cores, no network), inside 10 minutes.
#
#   1 info     nvidia-smi, Python, torch and CUDA versions                                   -> $OUT/info.log
#   2 install  the carried wheels (.whl/*.whl -> $SITE) and this checkout's packages (her, her_agents, her_envs,
#              her_configs: symlinks in $SRC when python3 cannot import them already)       -> $OUT/install.log
#   3 tests    the CUDA tests (pytest $TESTS: test_agents.py and test_gpu_check.py, -k cuda) -> $OUT/tests.log
#              meanwhile, one process per algorithm compiles the benchmark's updates once (Inductor's on-disk
#              cache), so the timed benchmark below compiles from the cache   -> $RESULTS/bench_warm_<algo>.log
#   4 bench    tests/benchmarks/bench_update.py --device cuda --layer-norm --compile: DDPG, TD3, SAC at batch
#              256 and 1024 in fp32 and bf16, each against its FLOP floor                     -> $OUT/bench.log
#   5 train    $CONFIG with train.device=cuda for each of $SEEDS side by side, $BUDGET_S seconds each (stopped
#              by SIGTERM: the run checkpoints and keeps its metrics), run directories in $WORK/runs;
#              -> $OUT/train.log and $RESULTS/<config>_s<seed>/{config.yaml,metrics.csv,stdout.log}
#   6 pack     $OUT/results -> $OUT/results.tar.gz (the device tool brings back at most 8 files from $OUT)
#
# A failing step does not stop the later ones; $OUT/summary.log has each step's exit status and the runs' last
# evaluations. Every step is bounded in time, and the training budget is cut to what is left of $TOTAL_S.
#
#   bash scripts/gpu_check.sh              # on the GPU machine (OUT is set there)
#   bash scripts/gpu_check.sh --dry-run    # the same steps on the CPU with tiny settings (GPU_CHECK_DEVICE=cpu):
#                                          # FetchReach, 2 seeds x 200 env steps, a 1-iteration benchmark
#
# Settings (environment variables; defaults for cuda / for the dry run):
#   OUT          where the logs and results go (./gpu_check_out)
#   WORK         the run directories (a new /tmp/gpu_check.XXXXXX)
#   SEEDS        seeds run side by side ("0 1 2 3" / "0 1")
#   CONFIG       her-train config (fetch_push_sac / fetch_reach_sac)
#   STEPS        train.total_env_steps (200000 / 200); BUDGET_S usually ends the run first
#   BUDGET_S     seconds per training run (150 / 120)
#   TRAIN_OVERRIDES  more her-train overrides ("" / tiny networks, batch 32, evaluations every 100 steps)
#   TESTS        pytest arguments
#   WHEELS       folder of wheels to install (.whl / none: the dry run uses the current environment's packages)
#   BENCH_ALGOS  algorithms to benchmark, one process each ("ddpg td3 sac" / ddpg)
#   BENCH_ARGS   more bench_update.py arguments; BENCH_WARM=0 skips the compile-ahead processes
#   TEST_TIMEOUT_S, BENCH_TIMEOUT_S   the tests' and the timed benchmark's limits (150, 120)
#   TOTAL_S      the whole check's time limit the steps are fitted into (540 / 300)
#   PYTHON       the interpreter (python3)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$(pwd)

dry=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $arg (use --dry-run or --help)" >&2; exit 2 ;;
  esac
done
[ "${GPU_CHECK_DEVICE:-cuda}" = cpu ] && dry=1

PYTHON=${PYTHON:-python3}
OUT=${OUT:-$repo/gpu_check_out}
WORK=${WORK:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
SITE=${SITE:-$WORK/site}  # the carried wheels, installed
SRC=${SRC:-$WORK/src}     # links to this checkout's packages when python3 lacks them
RESULTS=$OUT/results
if [ "$dry" = 1 ]; then
  DEV=cpu
  SEEDS=${SEEDS:-"0 1"}
  CONFIG=${CONFIG:-fetch_reach_sac}
  STEPS=${STEPS:-200}
  BUDGET_S=${BUDGET_S:-120}
  TOTAL_S=${TOTAL_S:-300}
  TRAIN_OVERRIDES=${TRAIN_OVERRIDES-"train.warmup_steps=100 train.learning_starts=100 train.eval_every=100 \
train.eval_episodes=2 train.batch_size=32 agent.hidden=[32,32] agent.compile=false"}
  TESTS=${TESTS:-"-q -p no:xdist tests/test_gpu_check.py -k cuda"}
  BENCH_ALGOS=${BENCH_ALGOS:-ddpg}
  BENCH_ARGS=${BENCH_ARGS:-"--batch-sizes 32 --precision fp32 --hidden 32 32 --iters 1 --warmup 1"}
  BENCH_WARM=${BENCH_WARM:-0}
  WHEELS=${WHEELS-}
else
  DEV=cuda
  SEEDS=${SEEDS:-"0 1 2 3"}
  CONFIG=${CONFIG:-fetch_push_sac}
  STEPS=${STEPS:-200000}
  BUDGET_S=${BUDGET_S:-150}
  TOTAL_S=${TOTAL_S:-540}
  TRAIN_OVERRIDES=${TRAIN_OVERRIDES-""}
  # xdist's -n 4 and pytest-timeout's --timeout where the image has them (KINDS.md lists both)
  TESTS=${TESTS:-"-v $("$PYTHON" -c 'import xdist' 2>/dev/null && echo "-n 4") \
$("$PYTHON" -c 'import pytest_timeout' 2>/dev/null && echo "--timeout 120") \
tests/test_agents.py tests/test_gpu_check.py -k cuda"}
  BENCH_ALGOS=${BENCH_ALGOS:-"ddpg td3 sac"}
  BENCH_ARGS=${BENCH_ARGS:-"--batch-sizes 256 1024 --precision fp32 bf16 --layer-norm --compile --iters 20"}
  BENCH_WARM=${BENCH_WARM:-1}
  WHEELS=${WHEELS-.whl}
fi
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-150}   # the tests, and the compile-ahead processes beside them
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-120}  # the timed benchmark, all algorithms
name=$(basename "${CONFIG%.yaml}")

rm -rf "$RESULTS" "$OUT/results.tar.gz" "$OUT"/{summary,info,install,tests,bench,train}.log  # a former check's
mkdir -p "$OUT" "$RESULTS" "$WORK/runs" "$SITE" || exit 1
export PYTHONPATH="$SITE:$SRC${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}  # several processes compile at once
export GPU_CHECK_INNER=1  # the dry-run test does not run itself again from inside the check
: >"$OUT/summary.log"

log() { echo "gpu_check: $*" | tee -a "$OUT/summary.log"; }
left() { echo $((TOTAL_S - SECONDS)); }  # seconds left of the check's limit

# run_step NAME FUNCTION: the function's output to the terminal and $OUT/NAME.log; its status to summary.log
run_step() {
  local step=$1 start=$SECONDS rc
  echo "=== $step ($(date -u +%H:%M:%S), ${SECONDS}s into the check)" | tee -a "$OUT/$step.log"
  "$2" 2>&1 | tee -a "$OUT/$step.log"
  rc=${PIPESTATUS[0]}
  log "$step: exit $rc in $((SECONDS - start)) s"
  return 0
}

pack() {  # results/ -> results.tar.gz: what comes back from the device is at most 8 files
  [ -d "$RESULTS" ] || return 0
  tar -czf "$OUT/results.tar.gz" -C "$OUT" results && rm -rf "$RESULTS"
}
trap 'pack' EXIT
trap 'log "stopped by a signal"; exit 143' TERM INT

step_info() {
  echo "mode: $([ "$dry" = 1 ] && echo "dry run on the CPU" || echo cuda); repo $repo; OUT $OUT; WORK $WORK"
  echo "host: $(uname -srm), $(nproc) cores, $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
  if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
  timeout 60 "$PYTHON" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| cudnn", torch.backends.cudnn.version(),
      "| cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"| {p.total_memory / 2**30:.0f} GiB | {p.multi_processor_count} SMs | capability",
          f"{p.major}.{p.minor} | bf16", torch.cuda.is_bf16_supported())
    import triton
    print("triton", triton.__version__)
EOF
}

step_install() {
  local rc=0
  if [ -n "$WHEELS" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "installing $(compgen -G "$WHEELS/*.whl" | wc -l) carried wheels into $SITE"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl || rc=1
  else
    echo "no wheels in '$WHEELS': using the installed packages (bash scripts/gpu_wheels.sh makes .whl/)"
  fi
  # this checkout's packages under their import names (pyproject.toml's package-dir), unless they import already
  if ! "$PYTHON" -c "import her, her_agents, her_envs, her_configs, sys, os
sys.exit(not her_agents.__file__.startswith(os.path.realpath('$repo')))" 2>/dev/null; then
    mkdir -p "$SRC"
    ln -sfn "$repo/her" "$SRC/her"; ln -sfn "$repo/agents" "$SRC/her_agents"
    ln -sfn "$repo/envs" "$SRC/her_envs"; ln -sfn "$repo/configs" "$SRC/her_configs"
    echo "packages linked in $SRC"
  fi
  "$PYTHON" - <<'EOF' || rc=1
import importlib
for name in ("gymnasium", "gymnasium_robotics", "mujoco", "omegaconf", "her", "her_agents", "her_envs",
             "her_configs"):  # torch: in the info step
    m = importlib.import_module(name)
    print(f"{name:20s} {getattr(m, '__version__', '')} {m.__file__}")
EOF
  return $rc
}

warm_pids=()
start_bench_warm() {  # compile every benchmarked update once, one process per algorithm, beside the tests
  [ "$BENCH_WARM" = 1 ] || return 0
  local algo
  for algo in $BENCH_ALGOS; do
    # shellcheck disable=SC2086
    timeout -k 10 "$TEST_TIMEOUT_S" "$PYTHON" tests/benchmarks/bench_update.py --device "$DEV" $BENCH_ARGS \
      --algos "$algo" --iters 1 --warmup 1 >"$RESULTS/bench_warm_$algo.log" 2>&1 &
    warm_pids+=($!)
  done
  echo "compiling ahead: $BENCH_ALGOS (pids ${warm_pids[*]})"
}

step_tests() {
  start_bench_warm
  # shellcheck disable=SC2086
  timeout -k 10 "$TEST_TIMEOUT_S" "$PYTHON" -m pytest -p no:cacheprovider $TESTS
  local rc=$? pid
  for pid in ${warm_pids[@]+"${warm_pids[@]}"}; do wait "$pid" || echo "compile-ahead process $pid: exit $?"; done
  # pytest's 5: nothing collected or selected (no CUDA test here) is no failure of the check
  [ "$rc" = 5 ] && rc=0
  return $rc
}

step_bench() {  # one process per algorithm, one after the other: a timeout loses one algorithm's lines only
  local end=$((SECONDS + BENCH_TIMEOUT_S)) n algo limit rc=0
  [ "$(left)" -lt "$BENCH_TIMEOUT_S" ] && end=$((SECONDS + $(left) / 2))
  n=$(wc -w <<<"$BENCH_ALGOS")
  for algo in $BENCH_ALGOS; do
    limit=$(( (end - SECONDS) / n )); n=$((n - 1))
    [ "$limit" -ge 10 ] || { echo "$algo: skipped, $((end - SECONDS)) s left"; rc=1; continue; }
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" "$PYTHON" tests/benchmarks/bench_update.py --device "$DEV" --algos "$algo" \
      $BENCH_ARGS || { echo "$algo: exit $? (limit $limit s)"; rc=1; }
  done
  return $rc
}

step_train() {
  local budget=$BUDGET_S seed run rd pids=() rc=0
  [ "$(left)" -lt $((budget + 50)) ] && budget=$(( $(left) - 50 ))
  [ "$budget" -ge 30 ] || { echo "skipped: $(left) s left"; return 1; }
  echo "$CONFIG x seeds [$SEEDS] side by side, $budget s each, train.device=$DEV, run directories in $WORK/runs"
  for seed in $SEEDS; do
    run=${name}_s$seed; rd=$WORK/runs/$run
    mkdir -p "$RESULTS/$run"
    # shellcheck disable=SC2086
    (timeout -k 30 "$budget" "$PYTHON" -m her_agents.cli "$CONFIG" train.device="$DEV" train.seed="$seed" \
       train.total_env_steps="$STEPS" log.wandb.mode=disabled log.progress=false log.run_dir="$rd" \
       $TRAIN_OVERRIDES --overwrite >"$RESULTS/$run/stdout.log" 2>&1
     echo $? >"$RESULTS/$run/exit_code") &
    pids+=($!)
  done
  wait "${pids[@]}"
  for seed in $SEEDS; do
    run=${name}_s$seed; rd=$WORK/runs/$run
    cp "$rd/config.yaml" "$rd/metrics.csv" "$RESULTS/$run/" 2>/dev/null || rc=1
    local code; code=$(cat "$RESULTS/$run/exit_code" 2>/dev/null || echo "?")
    echo "--- $run: exit $code$([ "$code" = 124 ] && echo " (stopped at the $budget s budget)")"
    tail -n 5 "$RESULTS/$run/stdout.log"
    # 0: done; 124: stopped at the budget (graceful, metrics kept); anything else failed
    case "$code" in 0|124) ;; *) rc=1 ;; esac
    [ -f "$RESULTS/$run/metrics.csv" ] || { echo "$run: no metrics.csv"; rc=1; continue; }
    "$PYTHON" - "$RESULTS/$run/metrics.csv" "$run" <<'EOF' | tee -a "$OUT/summary.log"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
last = rows[-1] if rows else {}
print(f"gpu_check: {sys.argv[2]}: {len(rows)} evaluations; last at {last.get('env_steps')} env steps, "
      f"{last.get('wall_time')} s: success {last.get('eval/success_rate')}, {last.get('env_steps_per_s')} steps/s")
EOF
  done
  return $rc
}

log "$(date -u '+%F %T') UTC, mode $DEV, OUT $OUT"
run_step info step_info
run_step install step_install
run_step tests step_tests
run_step bench step_bench
run_step train step_train
pack
trap - EXIT
log "done in $SECONDS s"
ls -la "$OUT"

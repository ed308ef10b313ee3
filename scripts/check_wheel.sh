#!/usr/bin/env bash
# The package as a user gets it from `pip install .` (a wheel, not editable): install it into a fresh virtualenv
# and run `her-train --help`, `--print-config` and a short FetchReach run from another directory, so the configs
# must come with the wheel. The dependencies are taken from the current environment (its site-packages on
# PYTHONPATH: no .pth file there runs, so its editable install of this repository stays out of the way).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Build from a copy of the sources: setuptools' build/ cache in the checkout could hold files no longer there.
mkdir "$tmp/src" && cp -r pyproject.toml README.md LICENSE her agents envs configs "$tmp/src/"
find "$tmp/src" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src"
"$python" -c 'import sys, zipfile; sys.exit(not any(n.endswith("dist-info/licenses/LICENSE") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$tmp"/dist/*.whl \
  || { echo "check_wheel: the wheel lacks LICENSE"; exit 1; }
"$python" -m venv --without-pip "$tmp/venv"
"$python" -m pip --python "$tmp/venv/bin/python" install -q --no-deps "$tmp"/dist/*.whl
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

mkdir "$tmp/elsewhere" && cd "$tmp/elsewhere"
export PYTHONPATH="$site" WANDB_MODE=offline
where=$("$tmp/venv/bin/python" -c 'import her, her_agents, her_envs, her_configs as c; print(her.__file__, her_agents.__file__, her_envs.__file__, c.__file__)')
case "$where" in "$tmp/venv/"*" $tmp/venv/"*" $tmp/venv/"*" $tmp/venv/"*) ;; *) echo "check_wheel: imported from $where, not the wheel"; exit 1;; esac
# No top-level name that collides with other distributions (OpenAI's Agents SDK installs `agents`).
top=$("$tmp/venv/bin/python" -c 'import os, sysconfig; d = sysconfig.get_paths()["purelib"]; print(" ".join(sorted(n for n in os.listdir(d) if os.path.isdir(os.path.join(d, n)) and not n.endswith(".dist-info") and n != "__pycache__")))')
[ "$top" = "her her_agents her_configs her_envs" ] || { echo "check_wheel: the wheel installs top-level [$top]"; exit 1; }
"$tmp/venv/bin/her-train" --help >/dev/null
printed=$("$tmp/venv/bin/her-train" --print-config) && grep -q "id: FetchPush-v4" <<<"$printed"
printed=$("$tmp/venv/bin/her-train" fetch_reach_ddpg --print-config train.seed=3) && grep -q "seed: 3" <<<"$printed"
"$tmp/venv/bin/her-train" fetch_reach_ddpg train.total_env_steps=200 train.eval_every=100 train.warmup_steps=50 \
  train.learning_starts=50 train.eval_episodes=2 env.eval_envs=2 log.progress=false log.run_dir=run >"$tmp/run.log" 2>&1 \
  || { cat "$tmp/run.log"; exit 1; }
grep -q "final eval success rate" "$tmp/run.log" && test -f run/checkpoint.pt && test -f run/metrics.csv
# The shipped policies come with the wheel and run without a run directory (her-eval pretrained:NAME).
listed=$("$tmp/venv/bin/her-eval" --list-pretrained)
[ -n "$listed" ] || { echo "check_wheel: her-eval --list-pretrained lists no shipped policy"; exit 1; }
for name in $listed; do
  out=$("$tmp/venv/bin/her-eval" "pretrained:$name" --episodes 2) || { echo "check_wheel: her-eval pretrained:$name failed"; exit 1; }
  grep -q "success rate" <<<"$out" || { echo "check_wheel: her-eval pretrained:$name printed [$out]"; exit 1; }
done
echo "check_wheel: the wheel's her-train works from another directory (${repo##*/} -> $tmp/elsewhere)"

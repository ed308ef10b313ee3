"""Env steps/s of the training loop on FetchPush-v4: 1 vs 2 data-parallel ranks, 1 vs 2 async envs.

Each configuration is a short real training run (warm-up, then 0.4 updates per env step); the number is the
loop's own ``env_steps_per_s`` from ``metrics.csv`` (for 2 ranks: ``dist/global_env_steps_per_s``, the sum over
ranks). Every process uses 1 torch thread. Run::

    python tests/benchmarks/bench_distributed.py                   # default 2000 env steps per run (per rank)
    python tests/benchmarks/bench_distributed.py --steps 4000

which runs, with ``COMMON="train.total_env_steps=2000 train.eval_every=2000 train.eval_episodes=2
env.eval_envs=2 log.progress=false log.checkpoint=false"`` and ``WANDB_MODE=disabled``::

    python -m her_agents.cli fetch_push_ddpg $COMMON                                              # 1 rank, 1 env
    torchrun --standalone --nproc_per_node=2 -m her_agents.cli fetch_push_ddpg $COMMON            # 2 ranks
    python -m her_agents.cli fetch_push_ddpg $COMMON env.n_envs=2 env.vectorization=async         # 2 async envs

On a machine with fewer free cores than processes the 2-process numbers measure contention, not scaling.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(label: str, launcher: list[str], extra: list[str], steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["fetch_push_ddpg", f"train.total_env_steps={steps}", f"train.eval_every={steps}",
                "train.eval_episodes=2", "env.eval_envs=2", "log.progress=false", "log.checkpoint=false",
                f"log.run_dir={tmp}/run", *extra]
        env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run([*launcher, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
        with open(Path(tmp) / "run" / "metrics.csv", newline="") as f:
            row = list(csv.DictReader(f))[-1]
    rate = float(row.get("dist/global_env_steps_per_s") or row["env_steps_per_s"])
    total = int(row.get("dist/global_env_steps") or row["env_steps"])
    return {"label": label, "env_steps": total, "steps_per_s": rate, "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="env steps per run (per rank)")
    a = p.parse_args()
    py = [sys.executable, "-m", "her_agents.cli"]
    tr = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "her_agents.cli"]
    results = [
        run("1 rank, 1 env (sync)", py, [], a.steps),
        run("2 ranks data-parallel, 1 env each", tr, [], a.steps),
        run("1 rank, 2 envs async", py, ["env.n_envs=2", "env.vectorization=async"], a.steps),
    ]
    base = results[0]["steps_per_s"]
    print(f"\nFetchPush-v4, DDPG, {a.steps} env steps per run (per rank), {os.cpu_count()} CPU cores\n")
    print("| setup | env steps | env steps/s | speed-up | wall s (incl. start-up) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['label']} | {r['env_steps']} | {r['steps_per_s']:.0f} | {r['steps_per_s'] / base:.2f}x "
              f"| {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()

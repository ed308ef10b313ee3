"""TD3, SAC and TQC, and DDPG with ``agent.precision=bf16``, learn FetchReach-v4 through the CLI (the fp32 DDPG run
is in ``test_train.py``).

Budgets (env steps, default ``fetch_reach_<algo>`` configs: 0.4 updates/env step x batch 256, 3x256 networks,
500 warm-up steps, eval every 1000 steps on 20 episodes), measured eval success at 1000/2000/3000 env steps:

- TD3: seed 0: 0.55, 1.0, 1.0; seed 1: 0.05, 1.0, 1.0; seed 2: 0.40, 1.0, 1.0 -> budget 3000
  (1000 steps of margin).
- SAC: seed 0: 1.0, 1.0; seed 1: 1.0, 1.0; seed 2: 0.80, 1.0 -> budget 2000 (1000 steps margin).
- TQC: seed 0: 0.90, 1.0, 1.0; seed 1: 0.50, 1.0, 1.0; seed 2: 0.90, 1.0 -> budget 3000 (1000 steps margin).
- DDPG bf16: seed 0: 0.95, 1.0, 1.0; seed 1: 0.80, 1.0, 1.0; seed 2: 1.0, 1.0, 1.0 -> budget 3000, as for
  fp32 DDPG.

Each run takes about 30 s of CPU time at one torch thread.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from her_agents.algos.base import native_bf16

BUDGETS = {"td3": 3000, "sac": 2000, "tqc": 3000}


def _reach_trajectory(algo: str, budget: int, run_dir: Path, *overrides: str) -> list[tuple[int, float]]:
    """Train ``fetch_reach_<algo>`` through the CLI for ``budget`` env steps; ``[(env_steps, eval success)]``."""
    cmd = [
        sys.executable,
        "-m",
        "her_agents.cli",
        f"fetch_reach_{algo}",
        f"train.total_env_steps={budget}",
        "train.seed=0",
        "train.eval_every=1000",
        "train.eval_episodes=20",
        "log.wandb.mode=disabled",
        "log.progress=false",
        "log.checkpoint=false",
        f"log.run_dir={run_dir}",
        *overrides,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    trajectory = [(int(r["env_steps"]), float(r["eval/success_rate"])) for r in rows]
    print(f"FetchReach-v4 {algo} {' '.join(overrides)} eval success by env step: {trajectory}")
    assert trajectory[-1][0] == budget
    return trajectory


@pytest.mark.parametrize("algo", sorted(BUDGETS))
def test_fetch_reach_cli_reaches_090_eval_success(algo: str, tmp_path: Path) -> None:
    budget = BUDGETS[algo]
    trajectory = _reach_trajectory(algo, budget, tmp_path / "run")
    assert trajectory[-1][1] >= 0.9, (
        f"{algo}: final eval success {trajectory[-1][1]} after {budget} env steps"
    )


@pytest.mark.skipif(not native_bf16(torch.device("cpu")),
                    reason="this CPU has no native bf16 (AVX512-BF16/AMX): emulated bf16 updates take 10x+ longer")
def test_fetch_reach_cli_ddpg_bf16_reaches_090_eval_success(tmp_path: Path) -> None:
    """``agent.precision=bf16`` (bf16 autocast forward passes in the update) still learns, same 3000-step
    budget as the fp32 DDPG run in ``test_train.py``."""
    trajectory = _reach_trajectory("ddpg", 3000, tmp_path / "run", "agent.precision=bf16")
    assert trajectory[-1][1] >= 0.9, f"ddpg bf16: final eval success {trajectory[-1][1]} after 3000 env steps"

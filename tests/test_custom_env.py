"""A goal env of the user's own, trained from the command line as ``env.id=module.path:EnvId-v0``
(docs/custom-env.md): the module is imported from the Python path or the current directory without being installed,
the run's config keeps the id so ``her-eval`` imports it again in a fresh process, and a module that cannot be
imported, an id it did not register and an env that is not a goal env are each one line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from her_agents.cli import train_main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "point_goal_env.py"
#: a budget the point env learns in (eval success 1.0 at 1500 env steps with seed 0)
BUDGET = ["train.total_env_steps=1500", "train.learning_starts=300", "train.eval_every=1500",
          "train.eval_episodes=10", "agent.compile=false", "log.progress=false", "log.wandb.mode=disabled"]


def _console_script(name: str) -> list[str]:
    """The installed console script (which, unlike ``python -m``, does not put the current directory on
    ``sys.path``), or ``python -c`` calling the same function where it is not installed beside this Python."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    main = {"her-train": "train_main", "her-eval": "eval_main"}[name]
    return [sys.executable, "-c", f"import sys; from her_agents.cli import {main}; sys.exit({main}(sys.argv[1:]))"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}


def test_her_train_trains_a_goal_env_from_a_module_in_the_current_directory_and_her_eval_finds_it(tmp_path):
    mods = tmp_path / "my_envs"
    mods.mkdir()
    shutil.copy(EXAMPLE, mods / "point_goal_env.py")  # not installed: a plain file in a plain folder
    run = tmp_path / "run"
    proc = subprocess.run([*_console_script("her-train"), "fetch_reach_ddpg", "env.id=point_goal_env:PointGoal-v0",
                           *BUDGET, f"log.run_dir={run}"], cwd=mods, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    final = re.search(r"final eval success rate ([\d.]+) after 1500 env steps", proc.stdout)
    assert final and float(final.group(1)) >= 0.8, proc.stdout  # it learned the env, not just ran
    assert yaml.safe_load((run / "config.yaml").read_text())["env"]["id"] == "point_goal_env:PointGoal-v0"

    # a fresh process elsewhere: the checkpoint's config names the module, found here on PYTHONPATH
    proc = subprocess.run([*_console_script("her-eval"), str(run), "--episodes", "5"], cwd=tmp_path,
                          env=_env(PYTHONPATH=str(mods)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"point_goal_env:PointGoal-v0 ddpg @ 1500 env steps: success rate [\d.]+ over 5 episodes",
                    proc.stdout), proc.stdout

    # and without it: one line saying where the module was looked for, not a traceback
    proc = subprocess.run([*_console_script("her-eval"), str(run), "--episodes", "5"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"her-eval: error: cannot build point_goal_env:PointGoal-v0: env id 'point_goal_env:PointGoal-v0': no "
        f"module named 'point_goal_env' on the Python path or in the current directory ({tmp_path}); add its "
        "folder to PYTHONPATH or run from it"], proc.stderr


def _one_error_line(capsys, argv: list[str]) -> str:
    code = train_main(["fetch_reach_ddpg", *argv, *BUDGET])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A folder on sys.path holding the example env and modules that go wrong in different ways."""
    shutil.copy(EXAMPLE, tmp_path / "point_goal_env_t.py")
    (tmp_path / "registers_nothing_t.py").write_text("X = 1\n")
    (tmp_path / "needs_missing_dep_t.py").write_text("import surely_not_installed_dep_t\n")
    (tmp_path / "raises_at_import_t.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "exits_at_import_t.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    return tmp_path


@pytest.mark.parametrize("env_id, expect", [
    ("no_such_module_t:Point-v0", "her-train: error: env id 'no_such_module_t:Point-v0': no module named "
                                  "'no_such_module_t' on the Python path or in the current directory"),
    ("point_goal_env_t:PointGoal-v9", "her-train: error: env id 'point_goal_env_t:PointGoal-v9': module "
                                      "'point_goal_env_t' did not register 'PointGoal-v9': it registers "
                                      "PointGoal-v0"),
    ("registers_nothing_t:Thing-v0", "did not register 'Thing-v0': it registers no env (call gymnasium.register "
                                     "in it)"),
    ("needs_missing_dep_t:Thing-v0", "importing module 'needs_missing_dep_t' failed: it imports "
                                     "'surely_not_installed_dep_t', which is not installed"),
    ("raises_at_import_t:Thing-v0", "importing module 'raises_at_import_t' raised RuntimeError: boom"),
    ("exits_at_import_t:Thing-v0", "importing module 'exits_at_import_t' called sys.exit(3)"),
    (":Thing-v0", "expected 'module.path:EnvId-v0'"),
    ("gymnasium.envs.classic_control:CartPole-v1", "her-train: error: gymnasium.envs.classic_control:CartPole-v1 "
                                                   "is not a goal env: expected a gymnasium.spaces.Dict"),
])
def test_a_module_env_id_that_cannot_train_is_one_line(capsys, modules, tmp_path, env_id, expect):
    line = _one_error_line(capsys, [f"env.id={env_id}", f"log.run_dir={tmp_path / 'run'}"])
    assert expect in line, line

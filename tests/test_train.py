"""The training loop, CLI, logging and checkpoints, on real Fetch envs."""

from __future__ import annotations

import csv
import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from her_agents.run.checkpoint import read_replay
from her_agents.algos.registry import make_agent
from her_agents.config import load_config
from her_agents.loop.train import build_replay, train
from her_agents.run.checkpoint import load_checkpoint
from her_envs import goal_env_spec, make_vector_env, split_autoreset

sys.path.insert(0, str(Path(__file__).parent))
from wandb_spy import ENV as SPY_ENV, differences_from_csv, finishes, history

SPY = str(Path(__file__).parent / "wandb_spy.py")  # her-train, with W&B's runs spied on (``$HER_WANDB_SPY``)

REACH_BUDGET = 3000  # env steps; FetchReach reaches 0.9 after ~1000-2000 here


def _cli(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "WANDB_MODE": "offline", **(env or {})}
    return subprocess.run([sys.executable, SPY, *args], capture_output=True, text=True, check=False, env=full_env,
                          timeout=timeout)


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def reach_run(tmp_path_factory) -> Path:
    """One FetchReach-v4 DDPG run through the CLI, W&B offline (what it sends to W&B in ``../wandb_spy.jsonl``)."""
    run_dir = tmp_path_factory.mktemp("reach") / "run"
    proc = _cli("fetch_reach_ddpg", f"train.total_env_steps={REACH_BUDGET}", "train.eval_every=1000",
                "train.eval_episodes=20", f"log.run_dir={run_dir}", "log.progress=false",
                "log.wandb.init_timeout_s=600",  # a loaded CI runner may take minutes to start W&B's service
                env={SPY_ENV: str(run_dir.parent / "wandb_spy.jsonl")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir.parent / "cli_output.txt").write_text(proc.stdout + proc.stderr)  # for the failure messages below
    return run_dir


def test_fetch_reach_cli_reaches_090_eval_success(reach_run):
    rows = _csv(reach_run / "metrics.csv")
    best = max(float(r["eval/success_rate"]) for r in rows)
    final = float(rows[-1]["eval/success_rate"])
    print(f"FetchReach-v4 eval success by env step: {[(r['env_steps'], r['eval/success_rate']) for r in rows]}")
    assert int(rows[-1]["env_steps"]) == REACH_BUDGET
    assert final >= 0.9, f"final eval success {final} (best {best}) after {REACH_BUDGET} env steps"


def test_run_dir_holds_the_resolved_config_as_print_config_gives_it(reach_run):
    proc = _cli("fetch_reach_ddpg", "--print-config", f"train.total_env_steps={REACH_BUDGET}", "train.eval_every=1000",
                "train.eval_episodes=20", f"log.run_dir={reach_run}", "log.progress=false", "log.wandb.init_timeout_s=600")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (reach_run / "config.yaml").read_text().strip() == proc.stdout.strip()


def test_metrics_csv_has_every_logged_column(reach_run):
    rows = _csv(reach_run / "metrics.csv")
    for key in ("eval/success_rate", "train/success_rate", "env_steps", "episodes", "updates", "env_steps_per_s",
                "train/critic_loss", "train/actor_loss", "train/q_mean", "wall_time"):
        assert key in rows[0], key
    assert [int(r["env_steps"]) for r in rows] == [1000, 2000, 3000]
    assert rows[-1]["train/critic_loss"] != ""


def test_wandb_offline_run_holds_every_row_once(reach_run):
    runs = glob.glob(str(reach_run / "wandb" / "offline-run-*"))
    out = (reach_run.parent / "cli_output.txt").read_text()
    assert len(runs) == 1, (runs, [line for line in out.splitlines() if "W&B" in line])
    spy, run_id = reach_run.parent / "wandb_spy.jsonl", load_checkpoint(reach_run / "checkpoint.pt")["wandb_id"]
    assert finishes(spy, run_id) == [(0, True)]
    csv_rows = _csv(reach_run / "metrics.csv")
    assert [r["env_steps"] for r in history(spy, run_id)] == [int(r["env_steps"]) for r in csv_rows]
    assert differences_from_csv(spy, run_id, csv_rows) == []  # eval/success_rate and every other column


def test_her_eval_reports_checkpoint_success(reach_run):
    proc = subprocess.run([sys.executable, "-c", ("import sys; from her_agents.cli import eval_main; "
                           f"sys.exit(eval_main(['{reach_run}', '--episodes', '10']))")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rate = float(proc.stdout.split("success rate ")[1].split()[0])
    assert rate >= 0.8, proc.stdout


def test_checkpoint_round_trip_gives_identical_actions(reach_run):
    state = load_checkpoint(reach_run / "checkpoint.pt")
    assert state["counters"]["env_steps"] == REACH_BUDGET
    assert state["counters"]["updates"] > 0
    spec = goal_env_spec("FetchReach-v4")
    agents = []
    for _ in range(2):
        a = make_agent(state["config"]["algo"], spec.observation_dim, spec.goal_dim, spec.action_dim,
                       device="cpu", **state["config"]["agent"])
        a.load_state_dict(state["agent"])
        agents.append(a)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(16, spec.observation_dim)).astype(np.float32)
    goal = rng.normal(size=(16, spec.goal_dim)).astype(np.float32)
    np.testing.assert_array_equal(agents[0].act(obs, goal, deterministic=True),
                                  agents[1].act(obs, goal, deterministic=True))
    # Reloading the saved state reproduces the saved state exactly.
    again = agents[0].state_dict()
    for k, v in state["agent"].items():
        if isinstance(v, dict):
            for kk, vv in v.items():
                if isinstance(vv, torch.Tensor):
                    assert torch.equal(vv, again[k][kk]), (k, kk)


def _small_cfg(tmp_path: Path, *extra: str):
    return load_config("fetch_reach_ddpg", [
        "train.total_env_steps=300", "train.warmup_steps=100", "train.learning_starts=100", "train.eval_every=300",
        "train.eval_episodes=2", "env.eval_envs=2", f"log.run_dir={tmp_path}", "log.progress=false",
        "log.wandb.mode=disabled", "replay.capacity=2000", *extra])


def test_compile_is_announced_and_a_failed_compile_is_one_line_that_training_survives(tmp_path, monkeypatch, capsys):
    def failing_compile(fn, **kwargs):
        def run(*args, **kw):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")
        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    result = train(_small_cfg(tmp_path / "run", "algo=sac", "agent.compile=true"))
    out = capsys.readouterr().out.splitlines()
    assert ("agent.compile: compiling the update (the first update takes 1-2 min on an idle core, seconds once cached "
            "on disk, minutes on a busy one)") in out
    failed = [line for line in out if "torch.compile" in line and "failed" in line]
    assert failed == ["RuntimeWarning: agent.compile: torch.compile of SACAgent.train_step failed, the update runs "
                      "eagerly (RuntimeError: InvalidCxxCompiler: No working C++ compiler found)"]
    assert result.history[-1]["updates"] > 0 and result.env_steps == 300


def test_same_seed_runs_store_identical_buffers(tmp_path):
    files = []
    for i in range(2):
        cfg = _small_cfg(tmp_path / f"run{i}", "log.save_replay=true", "train.seed=3")
        train(cfg)
        files.append(read_replay(tmp_path / f"run{i}"))
    a, b = files
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert int(a["storage/scalars"][2]) == 300  # all 6 episodes of 50 steps stored


def test_grasped_start_shapes_training_episodes_only(tmp_path, monkeypatch):
    import her_agents.loop.start

    built = []
    real = her_agents.loop.start.make_vector_env

    def recording(*args, **kwargs):
        built.append(kwargs.get("grasped_start", 0.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(her_agents.loop.start, "make_vector_env", recording)
    train(_small_cfg(tmp_path / "run", "env.id=FetchPickAndPlace-v4", "env.grasped_start=1.0", "log.save_replay=true"))
    assert built == [1.0, 0.0]  # the training envs, then the evaluation envs
    z = read_replay(tmp_path / "run")  # the storage as saved: base and episode log
    n = int(z["storage/scalars"][2])  # transitions stored (the arrays have the replay's capacity)
    first = z["storage/field.step"][:n] == 0
    box = z["storage/field.achieved_goal"][:n][first]
    grip = z["storage/field.observation"][:n][first][:, :3]
    assert len(box) == 6 and np.all(np.linalg.norm(box - grip, axis=1) < 0.02)  # every episode began held


def test_fetch_never_terminates_and_sampled_done_is_zero(tmp_path):
    cfg = _small_cfg(tmp_path)
    spec = goal_env_spec("FetchReach-v4")
    replay = build_replay(cfg, spec, total_updates=10)
    env = make_vector_env("FetchReach-v4", 1, seed=0)
    obs, _ = env.reset(seed=0)
    for _ in range(150):
        a = env.action_space.sample()
        nxt, r, term, trunc, infos = env.step(a)
        step = split_autoreset(nxt, term, trunc, infos)
        replay.add(obs, a, r, step.real_next_obs, term, trunc)
        obs = nxt
    env.close()
    assert replay.storage.n_episodes == 3
    b = replay.sample(4096)
    assert not b.terminated.any()
    assert (b.discount > 0).all()


def test_rewards_are_computed_on_raw_goals_and_normalizer_sees_relabeled_goals(tmp_path):
    """Observation normalization is on; the goals compute_reward receives are raw, in metres."""
    cfg = _small_cfg(tmp_path)
    spec = goal_env_spec("FetchReach-v4")
    seen = []
    env_reward = spec.compute_reward

    def recording_reward(ag, dg, info):
        seen.append((ag.copy(), dg.copy()))
        return env_reward(ag, dg, info)

    spec = spec.__class__(**{**spec.__dict__, "compute_reward": recording_reward})
    replay = build_replay(cfg, spec, total_updates=10)
    agent = make_agent("ddpg", spec.observation_dim, spec.goal_dim, spec.action_dim, device="cpu")
    env = make_vector_env("FetchReach-v4", 1, seed=1)
    obs, _ = env.reset(seed=1)
    relabeled_goals = []
    for _ in range(500):
        a = np.random.default_rng(len(relabeled_goals)).uniform(-0.2, 0.2, (1, 4)).astype(np.float32)
        nxt, r, term, trunc, infos = env.step(a)
        step = split_autoreset(nxt, term, trunc, infos)
        for start, T in replay.add(obs, a, r, step.real_next_obs, term, trunc):
            b = replay.batch_from_slots((start + np.arange(T)) % replay.storage.n_slots)
            agent.update_normalizer(b.observation, b.desired_goal)
            relabeled_goals.append(b.desired_goal[b.relabeled])
        obs = nxt
    env.close()
    seen.clear()
    batch = replay.sample(2048)
    agent.update(batch)
    ag = np.concatenate([s[0] for s in seen])
    mean, std = ag.mean(0), ag.std(0)
    assert 1.25 <= mean[0] <= 1.45 and 0.65 <= mean[1] <= 0.9 and 0.4 <= mean[2] <= 0.75, mean
    assert (std > 0.02).all() and (std < 0.2).all(), std
    # The goal normalizer's statistics include the relabeled goals (achieved goals of later steps).
    state = agent.state_dict()
    g_norm = state["goal_normalizer"] if "goal_normalizer" in state else state["normalizers"]["goal"]
    count = float(np.asarray(g_norm["count"]).reshape(-1)[0])
    assert count == pytest.approx(500), count  # every transition of the 10 episodes, relabeled where drawn
    assert sum(len(g) for g in relabeled_goals) > 300


@pytest.mark.parametrize("args, expect", [
    (["train.nonsense=1"], "nonsense"),
    (["replay.strategy=futur"], "strategy"),
    (["replay.n_sampled_goal=-1"], "n_sampled_goal"),
    (["env.id=FetchPsh-v4"], "FetchPush-v4"),
    (["env.id=CartPole-v1"], "goal env"),
    (["agent.learning_rate=0.1"], "learning_rate"),
    (["train.gamma=1.5"], "gamma"),
    (["notakeyvalue"], "key=value"),
    (["replay.prioritized=true", "replay.td_error_clip=-1"], "replay.td_error_clip must be a finite number > 0"),
    (["train.batch_size=1000000000000"], "train.batch_size must be in [1, replay.capacity]"),
    (["agent.hidden=[-3]"], "hidden layer sizes must be positive"),
])
def test_bad_config_gives_clear_error(tmp_path, args, expect):
    proc = _cli("fetch_reach_ddpg", *args, "train.total_env_steps=100", f"log.run_dir={tmp_path}",
                "log.wandb.mode=disabled", "log.progress=false", timeout=120)
    assert proc.returncode != 0
    assert expect in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]



def test_the_run_sizes_torch_and_the_compile_workers_from_train_torch_threads(monkeypatch):
    """``auto``: every core the process may use, for torch's threads and Inductor's compile workers alike; an
    int limits both (runs side by side)."""
    import torch._inductor.config as inductor_config

    import her_agents.config.sections
    from her_agents.loop.train import use_threads

    monkeypatch.setattr(inductor_config, "compile_threads", inductor_config.compile_threads)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # conftest limits the test processes to 1
    monkeypatch.setattr(her_agents.config.sections, "usable_cores", lambda: 3)
    before = torch.get_num_threads()
    try:
        serial = "train.overlap_env=false"  # the default overlaps: below
        assert use_threads(load_config(None, ["agent.compile=true", serial])) == 3
        assert torch.get_num_threads() == 3 and inductor_config.compile_threads == 3
        assert use_threads(load_config(None, ["agent.compile=true", "train.torch_threads=1"])) == 1
        assert torch.get_num_threads() == 1 and inductor_config.compile_threads == 1
        # overlapped, the env workers step meanwhile: a core each is left to them
        assert use_threads(load_config(None, ["train.overlap_env=true", "env.n_envs=2"])) == 1
        assert use_threads(load_config(None, ["train.overlap_env=true", "env.n_envs=1"])) == 2
        assert use_threads(load_config(None, ["train.overlap_env=true", "dist.mode=actor_learner"])) == 3
    finally:
        torch.set_num_threads(before)


def test_the_overlapped_loop_steps_a_worker_process_and_a_seed_gives_one_run(tmp_path, monkeypatch):
    """``train.overlap_env``: the training env steps in a worker process (also for one env) while the updates
    run; two runs of a seed are bit-identical, do as many updates as the serial loop, and differ from it only
    by the one-step lag (an episode a step ends joins the replay after that step's updates)."""
    import her_agents.loop.start
    from run_compare import differences, run_differences

    built = []
    real = her_agents.loop.start.make_vector_env

    def recording(env_id, n_envs, vectorization, *args, **kwargs):
        built.append((n_envs, vectorization))
        return real(env_id, n_envs, vectorization, *args, **kwargs)

    monkeypatch.setattr(her_agents.loop.start, "make_vector_env", recording)
    extra = ("train.updates_per_step=1", "log.save_replay=true", "env.n_envs=1")
    for name in ("a", "b"):
        train(_small_cfg(tmp_path / name, *extra, "train.overlap_env=true"))
    assert built == [(1, "async"), (2, "sync")] * 2  # training env in a worker; evaluation in this process
    train(_small_cfg(tmp_path / "serial", *extra))
    assert run_differences(tmp_path / "a", tmp_path / "b") == []
    overlapped, serial = (load_checkpoint(tmp_path / n / "checkpoint.pt") for n in ("a", "serial"))
    assert overlapped["counters"] == {**serial["counters"], "wall_time": overlapped["counters"]["wall_time"]}
    assert differences(overlapped["agent"], serial["agent"])  # the lag: other weights

"""Multi-process training: data-parallel (gradient all-reduce) and actor-learner (RPC), launched with torchrun
on localhost (gloo, 1 torch thread per process). The learning runs are marked ``slow``."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from her_agents.cli import train_main
from her_agents.config import load_config
from her_agents.distributed.data_parallel import init_distributed, rendezvous_env
from her_agents.run.checkpoint import load_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from run_compare import run_differences

HERE = Path(__file__).parent
ROOT = HERE.parent
TINY = ["train.warmup_steps=100", "train.learning_starts=100", "train.eval_episodes=4", "env.eval_envs=2",
        "agent.hidden=[64,64]", "log.progress=false"]


def _torchrun(nproc: int, args: list[str], run_dir: Path, dump: Path, env: dict | None = None,
              timeout: int = 600, resume: bool = False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "HER_DIST_DUMP": str(dump),
                "PYTHONPATH": str(ROOT), **(env or {})}
    run = ["--resume", str(run_dir)] if resume else ["fetch_reach_ddpg", f"log.run_dir={run_dir}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(HERE / "_dist_launch.py"), *run, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT, check=False)


def _rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------------------------- data parallel


def test_data_parallel_ranks_hold_identical_parameters_and_normalizers(tmp_path):
    """Also: no rank leaves before rank 0 is done (here rank 0 lingers 2 s after its loop, as writing its last
    files would): a rank that exits first has torchrun stop the others, rank 0 mid-write among them."""
    run_dir, dump = tmp_path / "run", tmp_path / "dump"
    proc = _torchrun(2, ["train.total_env_steps=300", "train.eval_every=300", *TINY], run_dir, dump,
                     env={"HER_TEST_SLOW_MAIN_FINISH": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float((dump / "exit1").read_text()) >= float((dump / "loop_end0").read_text())
    r0, r1 = _json(dump / "rank0.json"), _json(dump / "rank1.json")
    assert r0["num_updates"] == r1["num_updates"] == 80  # 0.4 updates x 200 learning steps, same K on both
    assert r0["params"] == r1["params"], "parameters differ across ranks after K updates"
    assert r0["normalizers"] == r1["normalizers"]
    assert r0["normalizer_count"] == 2 * 300  # both ranks' episodes in every rank's statistics
    rows = _rows(run_dir)  # rank 0 alone writes metrics.csv (one row, not two)
    assert len(rows) == 1 and int(rows[0]["dist/world_size"]) == 2 and int(rows[0]["dist/global_env_steps"]) == 600
    assert (run_dir / "checkpoint.pt").exists()


def test_data_parallel_resets_keep_the_ranks_identical(tmp_path):
    """``agent.reset_every``: each rank draws its new layers from its own seed (``train.seed + rank``); rank 0's
    are broadcast after each reset, so the ranks still hold identical parameters (resets at 30 and 60 of 80)."""
    run_dir, dump = tmp_path / "run", tmp_path / "dump"
    proc = _torchrun(2, ["train.total_env_steps=300", "train.eval_every=300", "agent.reset_every=30", *TINY],
                     run_dir, dump)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = _json(dump / "rank0.json"), _json(dump / "rank1.json")
    assert r0["num_updates"] == r1["num_updates"] == 80
    assert r0["params"] == r1["params"], "parameters differ across ranks after resets"


def test_data_parallel_resume_restores_each_ranks_own_state(tmp_path, capsys):
    """2 ranks, 200 env steps each, prioritized replay saved: uninterrupted, against killed right after the
    checkpoint at 100 and resumed under torchrun. Each rank resumes its own state (RNGs, env RNGs, replay,
    beta schedule, pending updates), so the runs end bit-identical; one process cannot resume it."""
    args = ["train.total_env_steps=200", "train.eval_every=100", "train.batch_size=64", "replay.capacity=5000",
            "replay.prioritized=true", "log.save_replay=true", *TINY, "train.warmup_steps=50",
            "train.learning_starts=50"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    proc = _torchrun(2, args, full, tmp_path / "dump_full")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _torchrun(2, args, resumed, tmp_path / "dump_killed", env={"HER_TEST_KILL_AFTER_CHECKPOINT": "100"})
    assert proc.returncode != 0 and "simulated kill after the checkpoint at 100" in proc.stderr, proc.stderr[-3000:]
    mid = load_checkpoint(resumed / "checkpoint.pt")
    assert mid["counters"]["env_steps"] == 100 and mid["world_size"] == 2 and len(mid["ranks"]) == 2
    assert mid["counters"]["updates"] > 0 and mid["replay_schedule"]["n_samples"] > 0
    assert mid["ranks"][0]["agent_rng"] != mid["ranks"][1]["agent_rng"]  # each rank's own state, not rank 0's
    assert mid["ranks"][0]["envs"] != mid["ranks"][1]["envs"]
    assert (resumed / "replay.npz").exists() and (resumed / "replay-rank1.npz").exists()
    assert (resumed / "replay-100.log").exists() and (resumed / "replay-rank1-100.log").exists()

    proc = _torchrun(2, [], resumed, tmp_path / "dump_resumed", resume=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert run_differences(full, resumed, ("replay.npz", "replay-rank1.npz")) == []
    for r in (0, 1):
        assert _json(tmp_path / "dump_resumed" / f"rank{r}.json") == _json(tmp_path / "dump_full" / f"rank{r}.json")

    # resuming in one process what two ranks wrote: refused, one line, nothing started
    assert train_main(["--resume", str(resumed), "train.total_env_steps=300"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 process(es)" in err and "--nproc_per_node=2" in err, err


@pytest.mark.slow
def test_data_parallel_fetch_reach_two_ranks_reaches_090(tmp_path):
    run_dir, dump = tmp_path / "run", tmp_path / "dump"
    proc = _torchrun(2, ["train.total_env_steps=2000", "train.eval_every=1000", "train.eval_episodes=10",
                         "log.progress=false"], run_dir, dump)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(run_dir)
    print("2-rank FetchReach eval success:", [(r["dist/global_env_steps"], r["eval/success_rate"]) for r in rows])
    assert float(rows[-1]["eval/success_rate"]) >= 0.9
    assert _json(dump / "rank0.json")["params"] == _json(dump / "rank1.json")["params"]


# ----------------------------------------------------------------------------------------------- actor-learner


def _check_actor_learner(dump: Path, n_actors: int) -> dict:
    learner = _json(dump / "learner.json")
    actors = [_json(dump / f"actor{r}.json") for r in range(1, n_actors + 1)]
    for a in actors:  # every episode an actor sent was stored exactly once
        assert learner["received"][str(a["rank"])] == a["sent"] > 0
    assert learner["duplicates"] == 0
    assert learner["n_episodes_added"] == sum(a["sent"] for a in actors)
    for a in actors:  # actors' weights follow the learner's: each loaded version hashes like the published one
        assert a["loaded"], "actor never loaded weights"
        for version, h in a["loaded"].items():
            assert learner["published"][version] == h, f"actor {a['rank']} version {version}"
    return learner


def test_actor_learner_stores_every_episode_once_and_actors_follow_weights(tmp_path):
    run_dir, dump = tmp_path / "run", tmp_path / "dump"
    proc = _torchrun(3, ["dist.mode=actor_learner", "dist.weight_sync_every=10", "train.total_env_steps=600",
                         "train.eval_every=600", *TINY], run_dir, dump)
    assert proc.returncode == 0, proc.stderr[-3000:]
    learner = _check_actor_learner(dump, 2)
    assert learner["env_steps"] >= 600
    assert len(learner["published"]) > 1


def test_actor_learner_resume_continues_the_learners_run(tmp_path):
    """``--resume`` of an actor-learner run is the loop's resume: the learner's agent, replay and counters
    continue from its checkpoint, rows follow on in order, and any number of actors resume it (here 1 of 2)."""
    run_dir, args = tmp_path / "run", ["dist.mode=actor_learner", "dist.weight_sync_every=10",
                                       "train.total_env_steps=300", "train.eval_every=150", "log.save_replay=true",
                                       *TINY]
    proc = _torchrun(3, args, run_dir, tmp_path / "dump1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = load_checkpoint(run_dir / "checkpoint.pt")
    done = first["counters"]["env_steps"]
    assert done >= 300 and first["world_size"] == 1 and first["hooks"]["weights_version"] > 1

    proc = _torchrun(2, ["train.total_env_steps=600"], run_dir, tmp_path / "dump2", resume=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed at {done} env steps" in proc.stdout + proc.stderr
    learner, actor = _json(tmp_path / "dump2" / "learner.json"), _json(tmp_path / "dump2" / "actor1.json")
    assert learner["received"] == {"1": actor["sent"]} and actor["sent"] > 0 and learner["duplicates"] == 0
    # the replay restored from the checkpoint, then every episode the actor sent
    assert learner["n_episodes_added"] == first["counters"]["episodes"] + actor["sent"]
    final = load_checkpoint(run_dir / "checkpoint.pt")
    assert final["counters"]["env_steps"] >= 600 and final["counters"]["updates"] > first["counters"]["updates"]
    assert final["counters"]["episodes"] == final["counters"]["env_steps"] // 50
    assert min(map(int, learner["published"])) == first["hooks"]["weights_version"] + 1  # versions continue
    steps = [int(r["env_steps"]) for r in _rows(run_dir)]
    assert steps == sorted(set(steps)) and steps[0] >= 150 and steps[-1] == final["counters"]["env_steps"], steps
    assert any(s <= done for s in steps) and any(s > done for s in steps)


def test_actor_learner_stops_on_a_signal_with_a_checkpoint_and_resumes(tmp_path):
    """SIGTERM to torchrun (as a scheduler sends it) reaches every rank: the learner's loop checkpoints and
    stops as one process does (exit 143, "stopped by SIGTERM"), the actors return; the run then resumes."""
    import signal
    import time

    run_dir, dump, log = tmp_path / "run", tmp_path / "dump", tmp_path / "log.txt"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "HER_DIST_DUMP": str(dump),
           "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
           str(HERE / "_dist_launch.py"), "fetch_reach_ddpg", f"log.run_dir={run_dir}", "dist.mode=actor_learner",
           "train.total_env_steps=100000", "train.eval_every=100", *TINY]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            deadline = time.monotonic() + 400
            while not (run_dir / "checkpoint.pt").exists():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert "her-train: stopped by SIGTERM at" in text, text[-3000:]
    assert "Traceback" not in text.split("her-train: stopped by SIGTERM")[0][-2000:]
    state = load_checkpoint(run_dir / "checkpoint.pt")
    stopped_at = state["counters"]["env_steps"]
    assert 100 <= stopped_at < 100000
    assert int(_rows(run_dir)[-1]["env_steps"]) <= stopped_at  # every row kept is covered by the checkpoint
    for r in (1, 2):  # the actors returned (their dumps are written after a clean shutdown)
        assert _json(dump / f"actor{r}.json")["sent"] > 0

    proc = _torchrun(3, [f"train.total_env_steps={stopped_at + 200}"], run_dir, tmp_path / "dump2", resume=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = load_checkpoint(run_dir / "checkpoint.pt")
    assert final["counters"]["env_steps"] >= stopped_at + 200
    steps = [int(r["env_steps"]) for r in _rows(run_dir)]
    assert steps == sorted(set(steps)), steps


@pytest.mark.slow
def test_actor_learner_fetch_reach_reaches_090(tmp_path):
    run_dir, dump = tmp_path / "run", tmp_path / "dump"
    proc = _torchrun(3, ["dist.mode=actor_learner", "dist.weight_sync_every=20", "train.total_env_steps=3000",
                         "train.eval_every=1000", "train.eval_episodes=20", "log.progress=false"], run_dir, dump)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_actor_learner(dump, 2)
    rows = _rows(run_dir)
    print("actor-learner FetchReach eval success:", [(r["env_steps"], r["eval/success_rate"]) for r in rows])
    assert float(rows[-1]["eval/success_rate"]) >= 0.9


# ----------------------------------------------------------------------------------------------- bad launches


@pytest.mark.parametrize("mode", ["data_parallel", "actor_learner"])
def test_ranks_with_different_configs_are_refused(tmp_path, mode):
    proc = _torchrun(2, [f"dist.mode={mode}", "train.total_env_steps=200", "dist.timeout_s=60", *TINY],
                     tmp_path / "run", tmp_path / "dump", env={"HER_TEST_RANK1_OVERRIDES": "train.batch_size=128"})
    assert proc.returncode != 0
    assert "different configs" in proc.stderr and "train.batch_size" in proc.stderr, proc.stderr[-3000:]
    assert "rank(s) [1]" in proc.stderr


def test_world_size_without_master_addr_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(RuntimeError, match=r"MASTER_ADDR.*torchrun"):
        init_distributed()


@pytest.mark.parametrize("env, expected", [
    ({"WORLD_SIZE": "2"}, "her-train: error: WORLD_SIZE=2 but the rendezvous variable(s) ['RANK', 'MASTER_ADDR', "
                          "'MASTER_PORT'] are not set. Launch with torchrun"),
    ({"WORLD_SIZE": "two"}, "her-train: error: the environment variable WORLD_SIZE must be a whole number (torchrun "
                            "sets it), got 'two': unset it for a single process"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     "her-train: error: rank 0: dist.backend=nccl needs a CUDA GPU per process on each node and a torch built with "
     "NCCL ("),
])
def test_launch_mistakes_are_one_line_from_her_train(monkeypatch, capsys, tmp_path, env, expected):
    """WORLD_SIZE without torchrun, a malformed one, nccl on a machine without CUDA (it was a RuntimeError
    traceback, an ``AttributeError: _cuda_setDevice`` on every rank)."""
    import torch

    for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, GPU or not, has none
    code = train_main(["fetch_reach_ddpg", "dist.backend=nccl", f"log.run_dir={tmp_path / 'run'}", *TINY])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(expected), err
    assert not (tmp_path / "run").exists()


def test_process_group_that_cannot_form_times_out_with_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    code = "from her_agents.distributed.data_parallel import init_distributed; init_distributed('gloo', timeout_s=3)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=ROOT, check=False)
    assert proc.returncode != 0
    assert "could not form the gloo process group of WORLD_SIZE=2" in proc.stderr, proc.stderr[-2000:]


def test_a_single_process_never_enters_the_distributed_code(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed() is None and rendezvous_env()["world_size"] == 1


def test_actor_learner_needs_two_processes(monkeypatch):
    from her_agents.distributed.actor_learner import train_actor_learner

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="at least 2 processes"):
        train_actor_learner(load_config("fetch_reach_ddpg", ["dist.mode=actor_learner"]))

"""Runs that never block and never lose what they logged: W&B fallback and final state, SIGINT /
SIGTERM checkpoints, W&B rows after stop + resume, run-directory ownership. Tiny FetchReach runs, seconds each.
"""

from __future__ import annotations

import csv
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from her_agents.run import run_control
from her_agents.config import load_config
from her_agents.loop.train import train
from her_agents.run.checkpoint import load_checkpoint
from her_agents.run.logger import RunLogger
from her_agents.run.run_control import RunDirInUse, RunDirLock, prepare_run_dir

sys.path.insert(0, str(Path(__file__).parent))
import wandb_spy
from run_compare import killed_at_200
from wandb_spy import ENV as SPY_ENV, events, finishes, history, summary

SPY = str(Path(__file__).parent / "wandb_spy.py")  # her-train, with W&B's runs spied on (``$HER_WANDB_SPY``)

TINY = ["train.warmup_steps=50", "train.learning_starts=50", "train.eval_episodes=1", "env.eval_envs=1",
        "agent.hidden=[16]", "train.batch_size=16", "replay.capacity=3000", "log.progress=false"]
FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"


def _env(**extra: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def _cli(args: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SPY, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


def _csv_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(r["env_steps"]) for r in csv.DictReader(f)]


def _wandb_steps(spy: Path, run_id: str) -> list[int]:
    """``env_steps`` of the evaluation rows W&B run ``run_id`` holds, in the order sent, over every process that
    logged to it. Each of those finished (W&B then has saved all it was sent)."""
    assert finishes(spy, run_id) and all(returned for _, returned in finishes(spy, run_id)), finishes(spy, run_id)
    return [int(r["env_steps"]) for r in history(spy, run_id)]


def _run_ids(spy: Path) -> list[str]:
    """The W&B run id of each ``wandb.init``, in order."""
    return [e["run"] for e in events(spy) if e["event"] == "init"]


def _small_cfg(run_dir: Path, *extra: str, mode: str = "offline"):
    return load_config("fetch_reach_ddpg", ["train.total_env_steps=300", "train.eval_every=100",
                                            f"log.run_dir={run_dir}", f"log.wandb.mode={mode}", *TINY, *extra])


# ---------------------------------------------------------------------------------------------------- W&B


@pytest.mark.parametrize("case", ["key_without_server", "online_without_key"])
def test_wandb_online_init_that_cannot_connect_falls_back_to_offline(tmp_path, case):
    run_dir, spy = tmp_path / "run", tmp_path / "spy.jsonl"
    if case == "key_without_server":  # a key, and a server address nothing listens on
        env = _env(WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL="http://127.0.0.1:9", HOME=str(tmp_path),
                   **{SPY_ENV: str(spy)})
    else:
        env = _env(HOME=str(tmp_path), **{SPY_ENV: str(spy)})  # no key, no netrc
    proc = _cli(["fetch_reach_ddpg", "train.total_env_steps=200", "train.eval_every=100", f"log.run_dir={run_dir}",
                 "log.wandb.mode=online", "log.wandb.init_timeout_s=3", *TINY], env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    warnings = [line for line in out.splitlines() if line.startswith("W&B: cannot log online")]
    assert len(warnings) == 1, out[-3000:]
    assert "logging offline" in warnings[0] and "wandb sync" in warnings[0]
    assert "Traceback" not in out and "Weave" not in out and "wandb:" not in out, out[-3000:]
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["counters"]["env_steps"] == 200
    runs = glob.glob(str(run_dir / "wandb" / "offline-run-*"))
    assert len(runs) == 1, runs
    assert [e["mode"] for e in events(spy) if e["event"] == "init"] == ["offline"]  # after the failed online init
    assert _wandb_steps(spy, state["wandb_id"]) == _csv_steps(run_dir) == [100, 200]
    assert finishes(spy, state["wandb_id"]) == [(0, True)]
    assert summary(spy, state["wandb_id"]) == {"run_status": "finished"}
    if case == "key_without_server":  # a resume falls back the same way: one line, its rows in W&B
        proc = _cli(["--resume", str(run_dir), "train.total_env_steps=300", "log.wandb.init_timeout_s=3"], env)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert [ln for ln in out.splitlines() if ln.startswith("W&B:")] == [
            ln for ln in out.splitlines() if ln.startswith("W&B: cannot log online")] != [], out[-3000:]
        assert len(glob.glob(str(run_dir / "wandb" / "offline-run-*"))) == 2
        assert _run_ids(spy) == [state["wandb_id"]] * 2
        assert _wandb_steps(spy, state["wandb_id"]) == _csv_steps(run_dir) == [100, 200, 300]


def test_a_stale_inherited_wandb_service_token_does_not_hold_up_the_run(tmp_path):
    """A parent Python process that used W&B leaves ``WANDB_SERVICE`` (its service's socket) in the environment of
    its children; once that service is gone, her-train starts its own instead of retrying until the deadline."""
    run_dir, spy = tmp_path / "run", tmp_path / "spy.jsonl"
    env = _env(WANDB_MODE="offline", WANDB_SERVICE=f"3-{os.getpid()}-unix-{tmp_path / 'gone' / 'socket'}",
               **{SPY_ENV: str(spy)})
    t0 = time.monotonic()
    proc = _cli(["fetch_reach_ddpg", "train.total_env_steps=200", "train.eval_every=100", f"log.run_dir={run_dir}",
                 "log.wandb.init_timeout_s=600", *TINY], env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "W&B:" not in out, out[-3000:]  # no fallback line: the run logged to W&B offline
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert _wandb_steps(spy, state["wandb_id"]) == _csv_steps(run_dir) == [100, 200]
    assert time.monotonic() - t0 < 300, "the run waited for the inherited service"


def test_wandb_fallback_takes_at_most_the_init_timeout(tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HOME", str(tmp_path))
    timeout = 3.0
    cfg = _small_cfg(tmp_path / "run", f"log.wandb.init_timeout_s={timeout}", mode="online")
    (tmp_path / "run").mkdir()
    import wandb

    real_init, calls = wandb.init, []

    def timed_init(*args, **kwargs):
        t0 = time.monotonic()
        try:
            return real_init(*args, **kwargs)
        finally:
            calls.append((kwargs["mode"], time.monotonic() - t0))

    monkeypatch.setattr(wandb, "init", timed_init)
    logger = RunLogger(cfg, tmp_path / "run")
    try:
        assert logger.mode == "offline" and logger.run is not None
        assert [mode for mode, _ in calls] == ["online", "offline"]
        online_s = calls[0][1]
        assert timeout <= online_s < timeout + 60, calls  # gives up after init_timeout_s (a margin for busy CI)
    finally:
        logger.finish()


def test_crashed_run_is_recorded_as_crashed_with_its_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    import her_agents.loop.steps as steps_mod

    calls = []
    real = steps_mod.learn_step

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) > 30:
            raise RuntimeError("simulated failure in the update")
        return real(*args, **kwargs)

    monkeypatch.setattr(steps_mod, "learn_step", failing)
    spy = wandb_spy.install(tmp_path / "spy.jsonl", monkeypatch)
    with pytest.raises(RuntimeError, match="simulated"):
        train(_small_cfg(tmp_path / "run"))
    (run_id,) = _run_ids(spy)
    assert finishes(spy, run_id) == [(1, True)]
    assert summary(spy, run_id) == {"run_status": "crashed", "error": "RuntimeError: simulated failure in the update"}


def _start(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, SPY, *args], stdout=f, stderr=subprocess.STDOUT, env=env)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.05)


@pytest.mark.parametrize("sig, code, status, loop", [
    (signal.SIGTERM, 143, "terminated", []), (signal.SIGINT, 130, "interrupted", []),
    (signal.SIGTERM, 143, "terminated", ["train.overlap_env=true"]),  # the env steps in a worker as it updates
], ids=["SIGTERM", "SIGINT", "SIGTERM-overlapped"])
def test_signal_checkpoints_finishes_wandb_and_resume_logs_every_row_once(tmp_path, sig, code, status, loop):
    run_dir, spy = tmp_path / "run", tmp_path / "spy.jsonl"
    env = _env(WANDB_MODE="offline", **{SPY_ENV: str(spy)})
    total = 20_000  # far more than runs before the signal: the run must stop on it
    proc = _start(["fetch_reach_ddpg", f"train.total_env_steps={total}", "train.eval_every=100",
                   f"log.run_dir={run_dir}", *TINY, *loop], tmp_path / "first.log", env)
    try:
        _wait_for(run_dir / "checkpoint.pt", proc)
        time.sleep(0.3)  # mid-way between two evaluations
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "first.log").read_text()
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    stop_lines = [line for line in out.splitlines() if "stopped by" in line]
    assert len(stop_lines) == 1 and signal.Signals(sig).name in stop_lines[0] and "--resume" in stop_lines[0]

    state = load_checkpoint(run_dir / "checkpoint.pt")  # the state at the signal, not the last evaluation's
    steps = state["counters"]["env_steps"]
    assert f"at {steps} env steps" in stop_lines[0]
    assert 100 <= steps < total
    assert finishes(spy, state["wandb_id"]) == [(code, True)]
    assert summary(spy, state["wandb_id"]) == {"run_status": status}
    assert _wandb_steps(spy, state["wandb_id"]) == _csv_steps(run_dir) == list(range(100, steps + 1, 100))

    end = (steps // 100 + 2) * 100
    proc2 = _cli(["--resume", str(run_dir), f"train.total_env_steps={end}"], env)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    end_state = load_checkpoint(run_dir / "checkpoint.pt")
    assert end_state["counters"]["env_steps"] == end
    assert end_state["config"]["train"]["overlap_env"] == bool(loop)  # the resume kept the loop it ran
    expected = list(range(100, end + 1, 100))
    assert _csv_steps(run_dir) == expected
    # each row once, in step order: the stopped run finished its W&B run, so nothing is sent twice
    assert _run_ids(spy) == [state["wandb_id"]] * 2
    assert _wandb_steps(spy, state["wandb_id"]) == expected


def test_resume_logs_the_rows_wandb_missed(tmp_path, monkeypatch):
    """A stop between a checkpoint and its W&B row: the resumed run logs that row first."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    real = RunLogger.checkpointed
    calls = []

    def dies_after_second_checkpoint(self):
        calls.append(1)
        if len(calls) == 2:  # checkpoint at 200 written, its row not yet sent to W&B
            raise RuntimeError("simulated kill")
        return real(self)

    monkeypatch.setattr(RunLogger, "checkpointed", dies_after_second_checkpoint)
    spy = wandb_spy.install(tmp_path / "spy.jsonl", monkeypatch)
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(_small_cfg(run_dir))
    monkeypatch.setattr(RunLogger, "checkpointed", real)
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["counters"]["env_steps"] == 200
    assert _wandb_steps(spy, state["wandb_id"]) == [100]
    assert _csv_steps(run_dir) == [100, 200]

    train(_small_cfg(run_dir), resume=str(run_dir))
    assert _csv_steps(run_dir) == [100, 200, 300]
    assert _wandb_steps(spy, state["wandb_id"]) == [100, 200, 300]


def _killed_before_the_checkpoint_at_200(real):
    def killed(run_dir, config, state, *args, **kwargs):
        if state.counters["env_steps"] == 200:
            raise RuntimeError("simulated kill before the checkpoint at 200 env steps")
        real(run_dir, config, state, *args, **kwargs)

    return killed


@pytest.mark.parametrize("kill", [_killed_before_the_checkpoint_at_200, killed_at_200],
                         ids=["before-checkpoint", "after-checkpoint"])
def test_each_eval_video_reaches_wandb_once_across_a_kill_and_resume(tmp_path, monkeypatch, kill):
    """``log.video_every=1``, a kill at the evaluation at 200 env steps, after its video was made: before its
    checkpoint (the resume redoes that evaluation and its video), or after it, before W&B was sent anything of it.
    Either way W&B is handed each evaluation's video exactly once, with the row of its ``env_steps``."""
    import numpy as np

    import her_agents.loop.steps as steps_mod
    import her_agents.run.video as video_mod

    monkeypatch.setenv("WANDB_MODE", "offline")
    # a tiny clip instead of a rendered episode: what is counted is what is handed to W&B, not what is drawn
    monkeypatch.setattr(video_mod, "record_episodes",
                        lambda *a, **k: (np.zeros((2, 16, 16, 3), np.uint8), np.zeros(1)))
    run_dir, real = tmp_path / "run", steps_mod.save_training_state
    monkeypatch.setattr(steps_mod, "save_training_state", kill(real))
    spy = wandb_spy.install(tmp_path / "spy.jsonl", monkeypatch)
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(_small_cfg(run_dir, "log.video_every=1"))
    monkeypatch.setattr(steps_mod, "save_training_state", real)
    train(_small_cfg(run_dir, "log.video_every=1"), resume=str(run_dir))

    run_id = load_checkpoint(run_dir / "checkpoint.pt")["wandb_id"]
    logged = [e["row"] for e in events(spy, run_id) if e["event"] == "log"]
    assert [r["env_steps"] for r in logged if "eval/video" in r] == [100, 200, 300]
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == [f"eval_{s:09d}.mp4" for s in (100, 200, 300)]
    assert _wandb_steps(spy, run_id) == _csv_steps(run_dir) == [100, 200, 300]


# ---------------------------------------------------------------------------------------------------- run dirs


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from her_agents.run.run_control import RunDirLock; RunDirLock(sys.argv[1]).acquire(); "
        "print('locked', flush=True); time.sleep(120)"), str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_run_dir_in_use_is_refused_and_a_dead_owners_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    owner = _hold_lock(run_dir)
    try:
        with pytest.raises(RunDirInUse, match=f"in use by another run \\(pid {owner.pid} on "):
            prepare_run_dir("FetchReach-v4", "ddpg", 0, str(run_dir), None)
        with pytest.raises(RunDirInUse, match=f"pid {owner.pid}"):  # train refuses before building anything
            train(_small_cfg(run_dir, mode="disabled"))
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    finally:
        owner.kill()
        owner.wait()
    # The owner died (SIGKILL): its lock file is left, stale, and taken over.
    assert f"pid {owner.pid}" in (run_dir / ".lock").read_text()
    lock = prepare_run_dir("FetchReach-v4", "ddpg", 0, str(run_dir), None)
    try:
        assert (run_dir / ".lock").read_text().startswith(f"pid {os.getpid()} on ")
        with pytest.raises(RunDirInUse):
            RunDirLock(run_dir).acquire()
    finally:
        lock.release()
    RunDirLock(run_dir).acquire().release()


def test_default_run_dirs_started_in_the_same_second_never_collide(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_control.time, "strftime", lambda fmt, *a: "20260101-120000")
    locks = [prepare_run_dir("FetchReach-v4", "ddpg", 0, None, None) for _ in range(3)]
    try:
        names = [lock.run_dir.name for lock in locks]
        assert names == ["FetchReach-v4-ddpg-s0-20260101-120000", "FetchReach-v4-ddpg-s0-20260101-120000-1",
                         "FetchReach-v4-ddpg-s0-20260101-120000-2"]
        assert all((tmp_path / "runs" / n).is_dir() for n in names)
    finally:
        for lock in locks:
            lock.release()


def test_fresh_run_into_a_run_dir_is_refused_and_overwrite_deletes_nothing_before_it_starts(tmp_path,
                                                                                         monkeypatch):
    """... and once it starts, the old run's W&B runs go with it."""
    run_dir = tmp_path / "run"
    train(_small_cfg(run_dir, "train.total_env_steps=100", mode="disabled"))
    old_wandb = [run_dir / "wandb" / "offline-run-20250101_000000-old", run_dir / "wandb" / "run-20250101_000000-x"]
    for d in old_wandb:  # the old run's W&B files, as an offline / online run leaves them
        d.mkdir(parents=True)
        (d / "run-old.wandb").write_bytes(b"old")
    before = {p: (run_dir / p).read_bytes() for p in ("checkpoint.pt", "metrics.csv", *(d / "run-old.wandb"
                                                                                           for d in old_wandb))}
    with pytest.raises(ValueError, match=r"holds a run's checkpoint.pt: continue that run with `her-train "
                                         r"--resume .*`, or start a new one there with `--overwrite`"):
        train(_small_cfg(run_dir, mode="disabled"))
    assert {p: (run_dir / p).read_bytes() for p in before} == before

    import her_agents.loop.start as start_mod

    def no_env(*args, **kwargs):
        raise RuntimeError("simulated failure at start")

    monkeypatch.setattr(start_mod, "make_vector_env", no_env)
    with pytest.raises(RuntimeError, match="simulated failure at start"):
        train(_small_cfg(run_dir, mode="disabled"), overwrite=True)
    assert {p: (run_dir / p).read_bytes() for p in before} == before  # the old run is intact
    monkeypatch.undo()

    train(_small_cfg(run_dir, "train.total_env_steps=200", mode="disabled"), overwrite=True)
    assert _csv_steps(run_dir) == [100, 200]  # the new run's rows only
    assert load_checkpoint(run_dir / "checkpoint.pt")["counters"]["env_steps"] == 200
    # `wandb sync <run_dir>/wandb/offline-run-*` uploads the new run only
    assert not any(d.exists() for d in old_wandb) and not glob.glob(str(run_dir / "wandb" / "*run-*"))


# ---------------------------------------------------------------------------------------------------- resume


def test_resume_without_replay_file_continues_the_prioritized_beta_schedule(tmp_path, monkeypatch):
    """Without ``log.save_replay`` the storage restarts empty, but the importance-sampling exponent keeps
    annealing from where the run stopped, not from beta0."""
    import her_agents.loop.state as state_mod
    import her_agents.loop.steps as steps_mod

    extra = ("replay.prioritized=true", "log.save_replay=false")
    full = tmp_path / "full"
    train(_small_cfg(full, *extra, mode="disabled"))
    full_state = load_checkpoint(full / "checkpoint.pt")

    real, calls = steps_mod.save_training_state, []

    def dies_after_second(*args, **kwargs):
        real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("simulated kill after the checkpoint at 200")

    monkeypatch.setattr(steps_mod, "save_training_state", dies_after_second)
    run_dir = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(_small_cfg(run_dir, *extra, mode="disabled"))
    monkeypatch.undo()
    mid = load_checkpoint(run_dir / "checkpoint.pt")
    assert mid["counters"]["env_steps"] == 200 and not (run_dir / "replay.npz").exists()
    assert mid["replay_schedule"]["n_samples"] == mid["counters"]["updates"] > 0

    seen = []
    real_load = state_mod.load_replay_schedule
    monkeypatch.setattr(state_mod, "load_replay_schedule",
                        lambda replay, sched: (real_load(replay, sched), seen.append(replay.sampler.beta)))
    train(_small_cfg(run_dir, *extra, mode="disabled"), resume=str(run_dir))
    total_updates = int(300 * 0.4)
    assert seen == [pytest.approx(0.4 + 0.6 * mid["counters"]["updates"] / total_updates)]  # not beta0
    end = load_checkpoint(run_dir / "checkpoint.pt")
    # The sampler counted on from the checkpoint: its count is every update of both processes (the resumed run
    # does fewer updates than the uninterrupted one while its empty replay fills up again).
    assert end["replay_schedule"]["n_samples"] == end["counters"]["updates"] > mid["counters"]["updates"]
    assert full_state["replay_schedule"]["n_samples"] == full_state["counters"]["updates"]


# ---------------------------------------------------------------------------------------------------- first lines


def test_first_line_says_where_the_run_goes_before_wandb_starts(tmp_path, monkeypatch):
    """With a key and no network an online ``wandb.init`` waits its whole timeout: the line comes first."""
    import wandb

    import her_agents.run.logger as logger_mod

    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("WANDB_API_KEY", "dummy")
    events = []
    monkeypatch.setattr(logger_mod.tqdm, "write", lambda line, *a, **k: events.append(line))

    class Run:
        id = "stub"

        def define_metric(self, *args, **kwargs):
            pass

        def finish(self, *args, **kwargs):
            pass

        summary: dict = {}

    def init(*args, mode, **kwargs):
        events.append(f"wandb.init {mode}")
        if mode == "online":
            raise TimeoutError("no answer")
        return Run()

    monkeypatch.setattr(wandb, "init", init)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logger = RunLogger(_small_cfg(run_dir, mode="auto"), run_dir)
    logger.finish()
    assert events[0] == (f"her-train: new run to 300 env steps in {run_dir} (W&B online: starting, up to 20 s, "
                         "else offline)")
    assert events[1] == "wandb.init online" and events[2].startswith("W&B: cannot log online")
    assert events[3] == "wandb.init offline"


def test_a_signal_is_acknowledged_at_once_with_what_the_stop_waits_for(capfd):
    with run_control.GracefulStop() as stop:
        stop.busy = "the first update's compile (1-2 min on an idle core)"
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs at the next bytecode
        assert stop.signum == signal.SIGINT
        assert capfd.readouterr().err == ("\nher-train: SIGINT received: stopping once the first update's compile "
                                          "(1-2 min on an idle core) is done (Ctrl-C again stops at once)\n")
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
    with run_control.GracefulStop() as stop:  # a SIGTERM comes from a scheduler or kill, not a keyboard
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert capfd.readouterr().err == ("\nher-train: SIGTERM received: stopping after the current env step "
                                          "(a second SIGTERM stops at once)\n")
    with run_control.GracefulStop(announce=False) as stop:  # data-parallel ranks > 0: rank 0 says it
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert stop.signum == signal.SIGTERM and capfd.readouterr().err == ""


def test_ctrl_c_during_the_first_updates_compile_is_acknowledged_at_once(tmp_path, capfd, monkeypatch):
    import her_agents.loop.steps as steps_mod

    def compiling(*args, **kwargs):  # the user presses Ctrl-C while the loss functions compile
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert "compile (1-2 min on an idle core) is done" in capfd.readouterr().err  # before the compile ends

    monkeypatch.setattr(steps_mod, "first_learn_step", compiling)
    with pytest.raises(run_control.TrainingStopped, match="stopped by SIGINT") as stopped:
        train(_small_cfg(tmp_path / "run", "agent.compile=true", mode="disabled"))
    assert stopped.value.env_steps < 100  # right after that update, before the first evaluation
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["counters"]["env_steps"] == stopped.value.env_steps


def test_ctrl_c_during_an_evaluation_stops_after_it_with_its_row_and_checkpoint(tmp_path, capfd, monkeypatch):
    import her_agents.loop.evaluation as evaluation_mod

    real, calls = evaluation_mod.evaluate, []

    def interrupted(*args, **kwargs):  # the user presses Ctrl-C while the first evaluation runs
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation_mod, "evaluate", interrupted)
    run_dir = tmp_path / "run"
    with pytest.raises(run_control.TrainingStopped, match="stopped by SIGINT at 100 env steps") as stopped:
        train(_small_cfg(run_dir, mode="disabled"))
    assert "SIGINT received: stopping once the evaluation at 100 env steps (and its checkpoint) is done" in \
        capfd.readouterr().err
    assert len(calls) == 1 and stopped.value.exit_code == 130
    assert _csv_steps(run_dir) == [100]  # the evaluation's row is kept
    assert load_checkpoint(run_dir / "checkpoint.pt")["counters"]["env_steps"] == 100


def test_a_second_ctrl_c_names_the_last_checkpoint_and_a_resume_without_replay_says_it_starts_empty(
        tmp_path, capsys, monkeypatch):
    import her_agents.cli as cli

    run_dir = tmp_path / "run"
    train(_small_cfg(run_dir, "train.total_env_steps=200", "log.save_replay=false", mode="disabled"))
    capsys.readouterr()

    def second_ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(cli, "run_training", second_ctrl_c)
        code = cli.train_main(["--resume", str(run_dir), "train.total_env_steps=300"])
    assert code == 130
    assert capsys.readouterr().err == (f"her-train: interrupted before its own checkpoint; the last one is in {run_dir}: "
                                       f"continue from it with `her-train --resume {run_dir}`\n")

    train(_small_cfg(run_dir, "train.total_env_steps=300", "log.save_replay=false", mode="disabled"),
          resume=str(run_dir))
    assert (f"her-train: no replay to restore in {run_dir}: the run saved none with its checkpoints, "
            "log.save_replay=false; the replay buffer starts empty, the agent, normalizers and counters continue"
            ) in capsys.readouterr().out


# ------------------------------------------------------------------------------- faults the run cannot go on from


@pytest.mark.parametrize("workers", [["env.vectorization=async"], ["train.overlap_env=true"]],
                         ids=["async", "overlapped"])
def test_a_killed_env_worker_stops_the_run_in_one_line_and_the_run_resumes(tmp_path, workers):
    """SIGKILL of one async env worker (the OOM killer): the run stops within seconds with one line naming the
    worker and the intact last checkpoint, no worker is left, and ``--resume`` continues (it hung forever).
    The same where the workers step while the loop updates (``train.overlap_env``)."""
    run_dir = tmp_path / "run"
    env = _env(WANDB_MODE="disabled")
    proc = _start(["fetch_reach_ddpg", "train.total_env_steps=20000", "train.eval_every=100", "env.n_envs=2",
                   *workers, f"log.run_dir={run_dir}", *TINY], tmp_path / "first.log", env)
    try:
        _wait_for(run_dir / "checkpoint.pt", proc)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            workers = [int(p) for p in f.read().split()]
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "first.log").read_text()
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    (line,) = [line for line in out.splitlines() if "error" in line]
    steps = load_checkpoint(run_dir / "checkpoint.pt")["counters"]["env_steps"]
    assert line.startswith(f"her-train: error: training env worker 1 (pid {workers[1]}) was killed by SIGKILL")
    assert line.endswith(f"the last checkpoint ({steps} env steps) is intact: continue with "
                         f"`her-train --resume {run_dir}`")
    time.sleep(0.5)
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")]

    proc2 = _cli(["--resume", str(run_dir), f"train.total_env_steps={steps + 100}"], env)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert load_checkpoint(run_dir / "checkpoint.pt")["counters"]["env_steps"] == steps + 100


def test_closing_the_terminal_stops_like_sigterm_with_a_checkpoint(tmp_path):
    """SIGHUP (the terminal was closed, so writing to it fails): the run writes its stop checkpoint and ends
    with 129 (it was killed without one)."""
    import pty

    run_dir = tmp_path / "run"
    master, tty = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "her_agents.cli", "fetch_reach_ddpg",
                             "train.total_env_steps=20000", "train.eval_every=100", f"log.run_dir={run_dir}", *TINY],
                            stdout=tty, stderr=tty, env=_env(WANDB_MODE="disabled"))
    os.close(tty)
    try:
        _wait_for(run_dir / "checkpoint.pt", proc)
        time.sleep(0.3)  # mid-way between two evaluations
        proc.send_signal(signal.SIGHUP)  # the kernel's hangup: the signal, then writes to the terminal fail
        os.close(master)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 129
    steps = load_checkpoint(run_dir / "checkpoint.pt")["counters"]["env_steps"]
    assert 100 <= steps < 20000
    proc2 = _cli(["--resume", str(run_dir), f"train.total_env_steps={steps + 100}"], _env(WANDB_MODE="disabled"))
    assert proc2.returncode == 0, proc2.stderr[-3000:]


@pytest.mark.parametrize("lr", ["1e6", "1e30"])
def test_diverging_networks_stop_the_run_in_one_line_and_keep_the_last_good_checkpoint(tmp_path, capsys, lr):
    """Learning rates far too large: the first non-finite loss or action stops the run with one line naming
    the keys to lower (it trained on with NaN actions, or stopped on one without saying why)."""
    import her_agents.cli as cli

    run_dir = tmp_path / "run"
    code = cli.train_main(["fetch_reach_ddpg", "train.total_env_steps=3000", "train.eval_every=100",
                           f"log.run_dir={run_dir}", "log.wandb.mode=disabled", f"agent.actor_lr={lr}",
                           f"agent.critic_lr={lr}", *TINY, "train.learning_starts=150"])  # a checkpoint first
    err = capsys.readouterr().err
    assert code == 1, err
    (line,) = err.strip().splitlines()
    assert line.startswith("her-train: error: the networks diverged (")
    assert f"lower agent.actor_lr, agent.critic_lr (now {float(lr):g}, {float(lr):g}) and start a new run" in line
    assert f"or continue the last checkpoint with them lowered (`her-train --resume {run_dir} agent.critic_lr=" in line
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["counters"]["env_steps"] >= 100
    assert f"the last checkpoint ({state['counters']['env_steps']} env steps) is kept in {run_dir}" in line
    tensors = [t for net in state["agent"].values() if isinstance(net, dict) for t in net.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert tensors and all(bool(torch.isfinite(t).all()) for t in tensors)


def _interrupt_after(args: list[str], seconds: float, env: dict) -> tuple[int, str]:
    """Run ``python <args>`` with a default SIGINT disposition, Ctrl-C it after ``seconds``; (rc, output)."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


@pytest.mark.parametrize("seconds", [0.8, 2.5])
def test_ctrl_c_while_her_train_imports_is_one_line(tmp_path, seconds):
    """Ctrl-C in the first seconds (torch importing, the config loading): one line, 130 (was a traceback)."""
    code, out = _interrupt_after(["-m", "her_agents.cli", "fetch_reach_ddpg", f"log.run_dir={tmp_path / 'run'}", *TINY],
                                 seconds, _env(WANDB_MODE="disabled"))
    # 130, or death by SIGINT after the line (a shell shows 130 for both): seen once under load, when the
    # interrupt landed inside torch's import; the interpreter, not her-train, then re-raised SIGINT at exit
    # on a fast start the interrupt may land once the loop runs: then the loop's own clean stop, also one line
    assert code in (130, -signal.SIGINT), out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(("her-train: interrupted", "her-train: stopped by SIGINT")), out[-3000:]
    assert "Traceback" not in out, out[-3000:]


def test_ctrl_c_during_her_eval_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    train(_small_cfg(run_dir, "train.total_env_steps=100", mode="disabled"))
    code, out = _interrupt_after(["-c", "import sys; from her_agents.cli import eval_main; sys.exit(eval_main())",
                                  str(run_dir), "--episodes", "100000"], 8,
                                 _env(WANDB_MODE="disabled"))
    assert code == 130, out[-3000:]
    assert out.strip() == "her-eval: interrupted", out[-3000:]


def test_a_closed_output_pipe_is_one_line_not_a_run_directory_error(tmp_path):
    """``her-train ... | head -1``: the reader ends, the next row cannot be printed; the line says so (it said
    "cannot write to the run directory: Broken pipe", and Python added an ignored-exception traceback)."""
    proc = subprocess.Popen([sys.executable, "-m", "her_agents.cli", "fetch_reach_ddpg", "train.total_env_steps=400",
                             "train.eval_every=100", f"log.run_dir={tmp_path / 'run'}", *TINY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(WANDB_MODE="disabled"))
    try:
        assert proc.stdout.readline().startswith("her-train: new run")
        proc.stdout.close()  # `head -1` exits
        err = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert err.startswith("her-train: error: the program reading its output ended (a closed pipe), so the run "
                          "stopped") and len(err.strip().splitlines()) == 1, err


class _FakeWandbRun:
    """What RunLogger uses of a W&B run: its id, ``log``, ``summary`` and ``finish`` (``timeout``: a finish that
    gives up uploading, as wandb's ``finish_timeout_raises`` reports it)."""

    def __init__(self, run_id: str, timeout: bool = False) -> None:
        self.id, self.logged, self.summary, self.timeout = run_id, [], {}, timeout

    def log(self, row: dict) -> None:
        self.logged.append(int(row["env_steps"]))

    def finish(self, exit_code: int | None = None) -> None:
        if self.timeout:
            raise TimeoutError("Timed out finishing run.")


def _row(step: int) -> dict:
    return {"env_steps": step, "episodes": step // 50, "updates": step, "wall_time": 1.0, "eval/success_rate": 0.5,
            "eval/final_distance": 0.1, "eval/return": -10.0, "train/success_rate": 0.5, "env_steps_per_s": 10.0}


def test_wandb_is_recorded_as_having_saved_a_row_only_once_its_finish_returned(tmp_path):
    """``wandb_saved.json`` records the last row W&B has certainly saved: a row goes to W&B once its checkpoint is
    written, but W&B buffers what it is handed, so only a ``finish`` that returns says it is saved. A resume sends
    the kept rows after the recorded one: after a kill (no finish), every row of the killed process again."""
    import json

    from her_agents.run.logger import SAVED_FILE

    record = tmp_path / "run" / SAVED_FILE
    cfg = _small_cfg(tmp_path / "run", mode="disabled")
    logger = RunLogger(cfg, tmp_path / "run")
    logger.run = _FakeWandbRun("abc")
    logger.log(_row(100), step=100)
    assert logger.run.logged == []  # not before its checkpoint
    logger.checkpointed()
    logger.log(_row(200), step=200)
    logger.checkpointed()
    assert logger.run.logged == [100, 200] and not record.exists()  # handed over, not known saved
    # SIGKILL here: W&B may have lost both rows (wandb 0.31 writes its buffer every 15 s)

    def resume(run_id: str, timeout: bool = False, new: tuple[int, ...] = ()) -> list[int]:
        again = RunLogger(cfg, tmp_path / "run", resume_step=200)
        again.run = _FakeWandbRun(run_id, timeout)
        again._send_unsaved([{k: str(v) for k, v in _row(s).items()} for s in (100, 200)])
        for s in new:
            again.log(_row(s), step=s)
            again.checkpointed()
        sent = again.run.logged
        again.finish("terminated")
        return sent

    assert resume("abc") == [100, 200]  # no record: every row again (a kept one lands on itself, same values)
    assert json.loads(record.read_text()) == {"run_id": "abc", "env_steps": 200}  # that finish returned
    assert resume("abc") == []  # saved: nothing twice
    assert resume("other") == [100, 200]  # a record of another W&B run says nothing of this one
    assert json.loads(record.read_text()) == {"run_id": "other", "env_steps": 200}
    record.write_text(json.dumps({"run_id": "abc", "env_steps": 100}))
    assert resume("abc", timeout=True, new=(300,)) == [200, 300]  # a finish that gave up uploading ...
    assert json.loads(record.read_text())["env_steps"] == 100  # ... saved nothing for sure: not recorded
    record.unlink()
    (tmp_path / "run" / "wandb_sent.json").write_text(json.dumps({"run_id": "abc", "env_steps": 200}))
    assert resume("abc") == [100, 200]  # the record of earlier versions (rows handed over) is not trusted


def test_a_failed_wandb_init_leaves_no_second_wandb_run(tmp_path, monkeypatch):
    """An offline init that fails and is retried (a busy machine) leaves the retry's run as the only W&B run dir."""
    import types

    import wandb

    from her_agents.config import load_config
    from her_agents.run.logger import RunLogger

    monkeypatch.delenv("WANDB_MODE", raising=False)
    calls = []

    def fake_init(mode=None, settings=None, dir=None, id=None, **kwargs):
        calls.append(mode)
        run_id = f"id{len(calls)}"
        (Path(dir) / "wandb" / f"offline-run-20261207_000000-{run_id}").mkdir(parents=True)
        if len(calls) == 1:
            raise RuntimeError("run ID is in use")
        return types.SimpleNamespace(id=run_id, define_metric=lambda *a, **k: None, log=lambda *a, **k: None,
                                     finish=lambda *a, **k: None)

    monkeypatch.setattr(wandb, "init", fake_init)
    monkeypatch.setattr("time.sleep", lambda s: None)
    cfg = load_config(None, ["log.wandb.mode=offline", f"log.run_dir={tmp_path}"])
    logger = RunLogger(cfg, tmp_path)
    assert calls == ["offline", "offline"] and logger.run.id == "id2"
    assert [p.name for p in (tmp_path / "wandb").iterdir()] == ["offline-run-20261207_000000-id2"]

"""Resumable runs: a training run killed with SIGKILL continues from its last checkpoint with ``--resume``.

Semantics checked here (docs/training.md, ``agents/run/checkpoint.py``, ``agents/run/logger.py``):

- ``checkpoint.pt`` (and ``replay.npz`` with ``log.save_replay=true``) is written at each evaluation, after that
  evaluation's ``metrics.csv`` row; a kill at any moment leaves a complete, loadable checkpoint and a replay
  file of the *same* env step (never a half-written file, never a temp file after the next save or resume).
- ``her-train --resume RUN_DIR`` restores networks, normalizers, optimizers, counters, RNG states and the replay
  storage, then continues from the checkpoint's env steps to ``train.total_env_steps``. The work done between
  the checkpoint and the kill is lost and redone.
- ``metrics.csv`` keeps its rows up to the checkpoint's env steps unchanged; rows the killed run logged after
  its checkpoint are dropped (their evaluations are redone). So after the resume the file has exactly one row
  per evaluation, ``env_steps`` strictly increasing.
- W&B: the resumed run reuses the checkpoint's run id (``resume="allow"``); W&B gets a row once its checkpoint
  is written, and the resumed run sends again the rows after the last one W&B has certainly saved (none of the
  killed run's), so over the killed and the resumed run it holds every ``metrics.csv`` row at least once, and
  nothing else, whatever W&B kept of the killed run (read through ``tests/wandb_spy.py``).
- Exact resume: a run killed right after a checkpoint taken between episodes and resumed ends bit-identical to
  the run that was never interrupted (networks, optimizers, normalizers, counters, every RNG, the envs' RNGs,
  the replay with its priorities and beta schedule, the metrics rows).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from her_agents.config import load_config
from her_agents.loop.train import train
from her_agents.run.checkpoint import load_checkpoint, load_replay_arrays, read_replay, save_run_state
from her_agents.run.logger import SAVED_FILE

sys.path.insert(0, str(Path(__file__).parent))
from run_compare import differences, killed_at_200, run_differences
from wandb_spy import ENV as SPY_ENV, differences_from_csv, events, finishes

SPY = str(Path(__file__).parent / "wandb_spy.py")  # her-train, with W&B's runs spied on

EVAL_EVERY = 500
TOTAL = 2000
# Small and fast: ~150 env steps/s on one busy CPU core.
FAST = ["train.warmup_steps=100", "train.learning_starts=100", "train.eval_episodes=2", "env.eval_envs=2",
        "agent.hidden=[64,64]", "train.batch_size=64", "replay.capacity=5000", "log.progress=false"]


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _leftovers(run_dir: Path) -> list[str]:
    """Temp files, replays not yet moved into place, episode logs of other bases than the checkpoint's: none may
    remain after a save or a resume."""
    names = [p.name for p in run_dir.iterdir()]
    try:
        base = (load_checkpoint(run_dir)["replay_files"] or {}).get("base")
    except (FileNotFoundError, ValueError):  # no checkpoint, or the bare ones of the kill-point test
        base = None
    return sorted(n for n in names if n.endswith(".tmp") or re.fullmatch(r"replay-\d+\.npz", n)
                  or (re.fullmatch(r"replay-\d+\.log", n) and n != f"replay-{base}.log"))


def _episodes(replay_arrays: dict) -> int:
    return len(replay_arrays["storage/episodes"])


def _wait_for_checkpoint(proc: subprocess.Popen, ckpt: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"training ended (rc {proc.returncode}) before its first checkpoint"
        if ckpt.exists():
            return load_checkpoint(ckpt)  # os.replace is atomic: never a partial file under this name
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint after {timeout} s")


def test_killed_run_resumes_from_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    spy = tmp_path / "wandb_spy.jsonl"
    env = {**os.environ, "WANDB_MODE": "offline", SPY_ENV: str(spy)}
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, SPY, "fetch_reach_ddpg", f"train.total_env_steps={TOTAL}",
             f"train.eval_every={EVAL_EVERY}", "log.save_replay=true", f"log.run_dir={run_dir}", *FAST],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            first = _wait_for_checkpoint(proc, run_dir / "checkpoint.pt", timeout=240)
            time.sleep(1.0)  # past the checkpoint: mid-way to the next evaluation (500 steps take ~3 s)
            assert proc.poll() is None, "the run finished before it could be killed; raise TOTAL"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # The checkpoint on disk now (maybe newer than the first one seen) is complete and loads.
    state = load_checkpoint(run_dir / "checkpoint.pt")
    steps = state["counters"]["env_steps"]
    assert steps >= first["counters"]["env_steps"] >= EVAL_EVERY
    assert steps % EVAL_EVERY == 0 and steps < TOTAL, steps
    assert state["counters"]["episodes"] == steps // 50
    assert set(state) >= {"agent", "config", "counters", "rng", "wandb_id"}
    wandb_id = state["wandb_id"]
    assert wandb_id
    # Its replay is the one of the same env step (finishing a save killed between checkpoint and replay).
    replay = read_replay(run_dir)
    assert _episodes(replay) == steps // 50
    assert _leftovers(run_dir) == []

    # Rows up to the checkpoint are kept as they are; simulate a kill between an evaluation's metrics.csv row
    # and its checkpoint by adding the row the killed run would have logged next.
    kept = [r for r in _rows(run_dir / "metrics.csv") if int(r["env_steps"]) <= steps]
    assert [int(r["env_steps"]) for r in kept] == list(range(EVAL_EVERY, steps + 1, EVAL_EVERY))
    with open(run_dir / "metrics.csv", "a", newline="") as f:
        fields = list(kept[0])
        ghost = {k: "" for k in fields} | {"env_steps": steps + EVAL_EVERY, "eval/success_rate": 0.123456}
        csv.DictWriter(f, fields).writerow(ghost)

    t0 = time.perf_counter()
    proc2 = subprocess.run([sys.executable, SPY, "--resume", str(run_dir)], capture_output=True, text=True, env=env,
                           timeout=600, check=False)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    print(f"resumed from {steps} env steps; resume took {time.perf_counter() - t0:.1f} s")

    rows = _rows(run_dir / "metrics.csv")
    got = [int(r["env_steps"]) for r in rows]
    assert got == list(range(EVAL_EVERY, TOTAL + 1, EVAL_EVERY)), got  # strictly increasing, no duplicates
    assert rows[: len(kept)] == [{**r, **{k: "" for k in rows[0] if k not in r}} for r in kept]
    assert "0.123456" not in {r["eval/success_rate"] for r in rows}
    after = rows[len(kept):]
    assert all(int(r["episodes"]) == int(r["env_steps"]) // 50 for r in after)
    assert all(int(r["updates"]) > int(kept[-1]["updates"]) for r in after)
    assert all(float(r["wall_time"]) > float(kept[-1]["wall_time"]) for r in after)

    final = load_checkpoint(run_dir / "checkpoint.pt")
    assert final["counters"]["env_steps"] == TOTAL
    assert final["counters"]["episodes"] == TOTAL // 50
    assert final["counters"]["evals"] == TOTAL // EVAL_EVERY
    assert final["wandb_id"] == wandb_id
    # The replay was restored: it holds the episodes from before the kill and those after the resume.
    final_replay = read_replay(run_dir)
    assert _episodes(final_replay) == TOTAL // 50
    assert int(final_replay["storage/scalars"][3]) == TOTAL // 50  # episodes ever added
    assert _leftovers(run_dir) == []
    # Both W&B processes (killed and resumed) logged to the same W&B run; the killed one never finished, so W&B may
    # have lost any of its rows: the resumed one sent them again. Whatever W&B kept, it holds every metrics.csv
    # row at least once (the same values at the same env_steps) and nothing else (not the ghost row).
    inits = [e for e in events(spy) if e["event"] == "init"]
    assert [(e["run"], e["mode"], e["resume"]) for e in inits] == [(wandb_id, "offline", None),
                                                                    (wandb_id, "offline", "allow")]
    assert finishes(spy, wandb_id) == [(0, True)]
    assert differences_from_csv(spy, wandb_id, rows) == []
    resent = [int(e["row"]["env_steps"]) for e in events(spy) if e["pid"] == inits[1]["pid"] and e["event"] == "log"]
    assert resent[: len(kept)] == [int(r["env_steps"]) for r in kept]  # first, every row of the killed run
    assert json.loads((run_dir / SAVED_FILE).read_text()) == {"run_id": wandb_id, "env_steps": TOTAL}


def _small_cfg(run_dir: Path, *extra: str):
    return load_config("fetch_reach_ddpg", [
        "train.total_env_steps=300", "train.eval_every=100", f"log.run_dir={run_dir}", "log.wandb.mode=disabled",
        "log.save_replay=true", *FAST, *extra])


def _failing_after(real, n_ok: int, calls: list):
    """Wrap a writer ``real(f, ...)``/``real(obj, f)``: the first ``n_ok`` calls work, the next writes part of its
    bytes to the file, then raises as a full disk would."""

    def fake(*args, **kwargs):
        calls.append(1)
        if len(calls) <= n_ok:
            return real(*args, **kwargs)
        f = next(a for a in args if hasattr(a, "write"))
        buf = io.BytesIO()
        real(*[buf if a is f else a for a in args], **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError(28, "No space left on device (simulated)")

    return fake


@pytest.mark.parametrize("writer", ["checkpoint", "replay"])
def test_interrupted_checkpoint_write_keeps_previous_checkpoint(tmp_path, monkeypatch, writer):
    run_dir = tmp_path / "run"
    calls: list = []
    if writer == "checkpoint":
        monkeypatch.setattr(torch, "save", _failing_after(torch.save, 1, calls))
    else:
        monkeypatch.setattr(np, "savez_compressed", _failing_after(np.savez_compressed, 1, calls))
    with pytest.raises(OSError, match="simulated"):
        train(_small_cfg(run_dir))
    assert len(calls) == 2
    monkeypatch.undo()

    state = load_checkpoint(run_dir / "checkpoint.pt")  # the previous one, complete
    assert state["counters"]["env_steps"] == 100
    assert _leftovers(run_dir) == [], "a failed write left files behind"
    replay = read_replay(run_dir)
    assert _episodes(replay) == 2
    assert [int(r["env_steps"]) for r in _rows(run_dir / "metrics.csv")] == [100]  # 200: no checkpoint covers it

    result = train(_small_cfg(run_dir), resume=str(run_dir))
    assert result.env_steps == 300
    assert [int(r["env_steps"]) for r in _rows(run_dir / "metrics.csv")] == [100, 200, 300]
    assert _episodes(read_replay(run_dir)) == 6


def test_resume_finishes_a_save_killed_between_checkpoint_and_replay(tmp_path):
    """Kill points of ``save_run_state`` (checkpoint and replay cannot be replaced together atomically)."""
    old = {"storage/x": np.arange(3)}
    new = {"storage/x": np.arange(5)}
    save_run_state(tmp_path, {"counters": {"env_steps": 100}}, old)
    # Killed after the new replay was written, before the checkpoint: the old pair is used, the stray removed.
    np.savez_compressed(tmp_path / "replay-200.npz", **new, **{"meta/env_steps": np.int64(200)})
    (tmp_path / "checkpoint.pt.abc.tmp").write_bytes(b"half a checkpoint")
    np.testing.assert_array_equal(load_replay_arrays(tmp_path, 100)["storage/x"], old["storage/x"])
    assert _leftovers(tmp_path) == []
    # Killed after the checkpoint, before the rename: the new replay is moved into place.
    np.savez_compressed(tmp_path / "replay-200.npz", **new, **{"meta/env_steps": np.int64(200)})
    np.testing.assert_array_equal(load_replay_arrays(tmp_path, 200)["storage/x"], new["storage/x"])
    assert _leftovers(tmp_path) == []
    # A replay of another checkpoint is refused, never silently paired.
    with pytest.raises(ValueError, match="do not belong together"):
        load_replay_arrays(tmp_path, 300)


@pytest.mark.parametrize("loop", [[], ["train.overlap_env=true", "train.updates_per_step=1"]],
                         ids=["serial", "overlapped"])
def test_resumed_prioritized_run_equals_the_uninterrupted_run(tmp_path, monkeypatch, loop):
    """400 env steps (2 envs, prioritized replay saved with each checkpoint) uninterrupted, against the same run
    killed right after its checkpoint at 200 env steps and resumed: the final checkpoints (parameters,
    optimizers, normalizers, counters, RNGs of the loop, torch, the agent, the replay and every train and eval
    env, the pending updates), the replay files (storage, priorities, beta schedule) and the metrics rows are
    bit-identical, clocks aside. The same for the loop that steps the envs in workers while it updates
    (``train.overlap_env``; one update per env step, so that updates fall on the steps that end episodes)."""
    import her_agents.loop.steps as steps_mod

    def cfg(run_dir: Path):
        return load_config("fetch_reach_ddpg", [
            "train.total_env_steps=400", "train.eval_every=100", "env.n_envs=2", "replay.prioritized=true",
            "log.save_replay=true", "log.wandb.mode=disabled", f"log.run_dir={run_dir}", *FAST, *loop])

    full, resumed = tmp_path / "full", tmp_path / "resumed"
    train(cfg(full))
    monkeypatch.setattr(steps_mod, "save_training_state", killed_at_200(steps_mod.save_training_state))
    with pytest.raises(RuntimeError, match="simulated kill"):
        train(cfg(resumed))
    monkeypatch.undo()
    mid = load_checkpoint(resumed / "checkpoint.pt")
    assert mid["counters"]["env_steps"] == 200 and mid["replay_schedule"]["n_samples"] > 0
    assert len(mid["envs"]["train"]) == 2 and len(mid["envs"]["eval"]) == 2

    result = train(cfg(resumed), resume=str(resumed))
    assert result.env_steps == 400 and [r["env_steps"] for r in result.history] == [300, 400]
    assert run_differences(full, resumed) == []


def test_atomic_writes_give_new_files_the_umask_mode_and_keep_an_old_files_mode(tmp_path):
    from her_agents.run.checkpoint import write_atomic

    mask = os.umask(0)
    os.umask(mask)
    new = tmp_path / "new.bin"
    write_atomic(new, lambda f: f.write(b"x"))
    assert new.stat().st_mode & 0o777 == 0o666 & ~mask  # mkstemp alone would leave 0600
    os.chmod(new, 0o640)
    write_atomic(new, lambda f: f.write(b"y"))
    assert new.stat().st_mode & 0o777 == 0o640 and new.read_bytes() == b"y"


#: a run written before ``agents/`` was split into wings (100 FetchReach env steps, ``agent.hidden=[16]``)
OLD_RUN = Path(__file__).parent / "data" / "run_v0_fetch_reach_ddpg"


def _pickled_globals(path: Path) -> set[str]:
    """The ``module.name`` of every class or function the pickle inside the torch checkpoint ``path`` refers to:
    unpickling imports each of them by that path."""
    import pickletools
    import zipfile

    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    found, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            found.add(".".join(strings[-2:]))
        if isinstance(arg, str):
            strings.append(arg)
    return found


def test_old_checkpoint_loads_evaluates_and_resumes(tmp_path, capsys):
    """A checkpoint holds plain containers, tensors and arrays, never a class of this package by its module path,
    so moving modules keeps old checkpoints loadable; one written before the move evaluates and resumes."""
    from her_agents.algos.registry import agent_from_checkpoint
    from her_agents.cli import eval_main, train_main

    run_dir = tmp_path / "old"
    run_dir.mkdir()
    for name in ("checkpoint.pt", "config.yaml", "metrics.csv"):
        (run_dir / name).write_bytes((OLD_RUN / name).read_bytes())
    ours = ("her.", "her_agents.", "her_envs.", "her_configs.")
    assert not [g for g in _pickled_globals(run_dir / "checkpoint.pt") if g.startswith(ours)]
    state = load_checkpoint(run_dir)
    assert state["counters"]["env_steps"] == 100
    agent = agent_from_checkpoint(state, compile=False)
    assert agent.act(np.zeros((1, 10), np.float32), np.zeros((1, 3), np.float32), deterministic=True).shape == (1, 4)

    assert eval_main([str(run_dir), "--episodes", "1"]) == 0
    assert "FetchReach-v4 ddpg @ 100 env steps" in capsys.readouterr().out
    assert train_main(["--resume", str(run_dir), "train.total_env_steps=150", "train.eval_every=50"]) == 0
    resumed = load_checkpoint(run_dir)
    assert resumed["counters"]["env_steps"] == 150
    assert [int(r["env_steps"]) for r in _rows(run_dir / "metrics.csv")] == [100, 150]
    assert not [g for g in _pickled_globals(run_dir / "checkpoint.pt") if g.startswith(ours)]


class _RunsCode:
    """Pickles as a call of ``os.system``: what a shared checkpoint could carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path, capsys):
    """``her-eval`` and ``--resume`` load weights only: a pickled callable is refused in one line, never run."""
    from her_agents.cli import eval_main, train_main

    marker = tmp_path / "ran"
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    for name in ("checkpoint.pt", "config.yaml", "metrics.csv"):
        (run_dir / name).write_bytes((OLD_RUN / name).read_bytes())
    state = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    state["counters"]["payload"] = _RunsCode(marker)
    torch.save(state, run_dir / "checkpoint.pt")

    with pytest.raises(ValueError, match=r"refused: loading it would run code \(posix.system\)") as info:
        load_checkpoint(run_dir)
    assert "\n" not in str(info.value)
    capsys.readouterr()
    for main, args in ((eval_main, [str(run_dir), "--episodes", "1"]),
                       (train_main, ["--resume", str(run_dir), "train.total_env_steps=150"])):
        try:
            code = main(args)
        except SystemExit as exited:  # her-eval's argparse error
            code = exited.code
        assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 2 and all("refused: loading it would run code (posix.system)" in e for e in errors), errors
    assert not marker.exists()


@pytest.mark.parametrize("content, expect", [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "cannot be read (UnicodeDecodeError: "),
    (b"step,time\n1,2\n", "cannot be read (no env_steps column; its header is 'step,time')"),
    (b"env_steps,wall_time\nabc,1\n", "cannot be read (line 2: env_steps 'abc' is not a number)"),
])
def test_an_unreadable_metrics_csv_on_resume_is_one_line_naming_it(tmp_path, capsys, content, expect):
    from her_agents.cli import train_main

    run_dir = tmp_path / "old"
    run_dir.mkdir()
    for name in ("checkpoint.pt", "config.yaml"):
        (run_dir / name).write_bytes((OLD_RUN / name).read_bytes())
    (run_dir / "metrics.csv").write_bytes(content)
    assert train_main(["--resume", str(run_dir), "train.total_env_steps=150", "train.eval_every=50"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [f"her-train: error: --resume: {run_dir / 'metrics.csv'} " + errors[0].split(" ", 4)[-1]]
    assert expect in errors[0] and errors[0].endswith("move it away to resume without its rows"), errors
    assert load_checkpoint(run_dir)["counters"]["env_steps"] == 100  # nothing written


def test_a_metrics_csv_with_a_byte_order_mark_resumes(tmp_path):
    from her_agents.cli import train_main

    run_dir = tmp_path / "old"
    run_dir.mkdir()
    for name in ("checkpoint.pt", "config.yaml"):
        (run_dir / name).write_bytes((OLD_RUN / name).read_bytes())
    (run_dir / "metrics.csv").write_bytes(b"\xef\xbb\xbf" + (OLD_RUN / "metrics.csv").read_bytes())
    assert train_main(["--resume", str(run_dir), "train.total_env_steps=150", "train.eval_every=50"]) == 0
    assert [int(r["env_steps"]) for r in _rows(run_dir / "metrics.csv")] == [100, 150]
    assert not (run_dir / "metrics.csv").read_bytes().startswith(b"\xef\xbb\xbf")


def _default_cfg(run_dir: Path, *extra: str):
    """A small run with the default ``log.save_replay``."""
    return load_config("fetch_reach_ddpg", ["train.total_env_steps=300", "train.eval_every=100",
                                            f"log.run_dir={run_dir}", "log.wandb.mode=disabled", *FAST, *extra])


def test_resume_restores_the_replay_by_default_from_a_base_and_an_append_only_episode_log(tmp_path, capsys):
    """Without ``log.save_replay`` set, a checkpoint saves the replay: the base is written once (at the first
    checkpoint) and each later checkpoint appends its new episodes to the log; a resume restores them all."""
    run_dir = tmp_path / "run"
    assert _default_cfg(run_dir).log.save_replay is True
    train(_default_cfg(run_dir))
    state = load_checkpoint(run_dir)
    assert state["format"] == 1 and state["replay_files"]["base"] == 100  # not rewritten at 200 nor 300
    with np.load(run_dir / "replay.npz") as z:  # no object arrays: read without unpickling
        assert int(z["meta/env_steps"]) == 100 and int(z["meta/format"]) == 1
    log = run_dir / "replay-100.log"
    assert log.stat().st_size == state["replay_files"]["log_bytes"] and _leftovers(run_dir) == []
    assert _episodes(read_replay(run_dir)) == 6
    capsys.readouterr()
    train(_default_cfg(run_dir, "train.total_env_steps=400"), resume=str(run_dir))
    assert "no replay to restore" not in capsys.readouterr().out
    final = read_replay(run_dir)
    assert _episodes(final) == 8 and int(final["storage/scalars"][3]) == 8  # the 6 restored, 2 more
    assert load_checkpoint(run_dir)["replay_files"]["base"] == 100 and _leftovers(run_dir) == []


def test_the_base_is_rewritten_once_the_log_would_outgrow_the_replay(tmp_path):
    run_dir = tmp_path / "run"
    train(_default_cfg(run_dir, "replay.capacity=100"))  # two episodes: each checkpoint's new ones fill it
    state = load_checkpoint(run_dir)
    assert state["replay_files"]["base"] == 300
    assert sorted(p.name for p in run_dir.glob("replay*")) == ["replay-300.log", "replay.npz"]
    assert _episodes(read_replay(run_dir)) == 2


def test_a_save_cut_short_mid_append_loses_nothing_already_saved(tmp_path):
    """Bytes appended by a save that was killed before its checkpoint (or a chunk cut short) are not read: the
    resume restores the checkpoint's episodes exactly and cuts the log back."""
    run_dir = tmp_path / "run"
    train(_default_cfg(run_dir))
    before = read_replay(run_dir)
    size = load_checkpoint(run_dir)["replay_files"]["log_bytes"]
    with open(run_dir / "replay-100.log", "ab") as f:
        f.write(b"EPIS\xff\xff\xff\xff\x00\x00\x00\x00half a chunk")
    assert differences(read_replay(run_dir), before) == []
    train(_default_cfg(run_dir, "train.total_env_steps=400"), resume=str(run_dir))
    after = read_replay(run_dir)
    assert _episodes(after) == 8
    with open(run_dir / "replay-100.log", "rb") as f:
        assert b"half a chunk" not in f.read() and size < load_checkpoint(run_dir)["replay_files"]["log_bytes"]


def _as_format_0(run_dir: Path, extra_rng: object = None) -> None:
    """Rewrite a run directory in the layout before formats existed: ``checkpoint.pt`` without ``format``,
    ``replay_files`` and ``replay_sampler``; ``replay.npz`` holding the whole buffer (storage, sampler, RNG as
    object arrays) and no ``meta/format``; no episode log."""
    from her_agents.run.checkpoint import flatten_arrays, write_pending_replay

    storage = {k: v for k, v in read_replay(run_dir).items() if k != "storage/format"}
    state = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    for key in ("format", "replay_files", "replay_sampler"):
        del state[key]
    torch.save(state, run_dir / "checkpoint.pt")
    rng = flatten_arrays({"rng": state["replay_schedule"]["rng"]})
    assert any(v.dtype == object for v in rng.values())  # PCG64's 128-bit state: pickled object arrays
    if extra_rng is not None:
        rng["rng/extra"] = np.asarray([extra_rng], dtype=object)
    for p in run_dir.glob("replay*"):
        p.unlink()
    steps = state["counters"]["env_steps"]
    write_pending_replay(run_dir, {**storage, "sampler/": np.zeros(0), **rng}, steps).rename(run_dir / "replay.npz")


def test_a_run_of_format_0_resumes_with_its_replay_and_a_pickled_callable_in_it_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(_default_cfg(run_dir))
    saved = read_replay(run_dir)
    _as_format_0(run_dir)
    assert "format" not in torch.load(run_dir / "checkpoint.pt", weights_only=False)
    state = load_checkpoint(run_dir)  # migrated
    assert state["format"] == 1 and state["replay_files"] is None and state["replay_sampler"] is None
    capsys.readouterr()
    train(_default_cfg(run_dir, "train.total_env_steps=400"), resume=str(run_dir))
    assert "no replay to restore" not in capsys.readouterr().out
    after = read_replay(run_dir)
    assert _episodes(after) == 8  # the 6 of the format-0 replay, 2 more
    np.testing.assert_array_equal(after["storage/field.observation"][:10], saved["storage/field.observation"][:10])

    marker = tmp_path / "ran"
    _as_format_0(run_dir, extra_rng=_RunsCode(marker))
    with pytest.raises(ValueError, match=r"replay .*replay.npz cannot be read: .*it needs code to load \(posix.system\)"):
        train(_default_cfg(run_dir, "train.total_env_steps=500"), resume=str(run_dir))
    assert not marker.exists()


def test_files_of_an_unknown_format_are_one_line_naming_the_versions(tmp_path):
    run_dir = tmp_path / "run"
    train(_default_cfg(run_dir, "train.total_env_steps=200"))
    arrays = dict(np.load(run_dir / "replay.npz"))
    arrays["meta/format"] = np.asarray(9)
    np.savez(run_dir / "replay.npz", **arrays)
    with pytest.raises(ValueError, match=rf"^replay {re.escape(str(run_dir))}/replay.npz is of format 9; this "
                       r"version of her-robotics reads formats 0 to 1 \(a newer version wrote it\?\)$"):
        train(_default_cfg(run_dir, "train.total_env_steps=300"), resume=str(run_dir))
    state = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    state["format"] = 9
    torch.save(state, run_dir / "checkpoint.pt")
    with pytest.raises(ValueError, match=rf"^checkpoint {re.escape(str(run_dir))}/checkpoint.pt is of format 9; "
                       r"this version of her-robotics reads formats 0 to 1 \(a newer version wrote it\?\)$"):
        load_checkpoint(run_dir)


def test_a_missing_replay_says_what_is_the_case(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(_default_cfg(run_dir, "train.total_env_steps=200"))
    (run_dir / "replay.npz").unlink()
    capsys.readouterr()
    train(_default_cfg(run_dir, "train.total_env_steps=300"), resume=str(run_dir))
    assert (f"her-train: no replay to restore in {run_dir}: replay.npz is missing, although the run saved its "
            "replay with each checkpoint (deleted or moved?); the replay buffer starts empty") in capsys.readouterr().out
    assert _leftovers(run_dir) == [] and load_checkpoint(run_dir)["replay_files"]["base"] == 300  # a new base


def test_a_format_0_checkpoint_without_its_later_entries_resumes(tmp_path):
    """Format-0 checkpoints from before the agent RNG, update schedule, evaluation window, hooks, env RNGs and
    world size were saved: ``migrate_checkpoint`` stands them in (None: the freshly built values stay)."""
    from her_agents.cli import train_main
    from her_agents.run.checkpoint import migrate_checkpoint

    run_dir = tmp_path / "older"
    run_dir.mkdir()
    for name in ("checkpoint.pt", "config.yaml", "metrics.csv"):
        (run_dir / name).write_bytes((OLD_RUN / name).read_bytes())
    state = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    for key in ("agent_rng", "replay_schedule", "update_schedule", "eval_window", "hooks", "envs", "world_size"):
        del state[key]
    torch.save(state, run_dir / "checkpoint.pt")
    migrated = migrate_checkpoint(state)
    assert migrated["format"] == 1 and migrated["world_size"] == 1 and migrated["hooks"] == {}
    assert migrated["agent_rng"] is None and migrated["replay_files"] is None
    assert train_main(["--resume", str(run_dir), "train.total_env_steps=150", "train.eval_every=50"]) == 0
    assert load_checkpoint(run_dir)["counters"]["env_steps"] == 150


def test_resume_with_another_learning_rate_and_weight_decay_trains_and_records_them(tmp_path):
    """``her-train --resume RUN agent.critic_lr=...``: the resumed optimizers step at the override (loading their
    state brought back the checkpoint's learning rate and weight decay, which the run then kept, silently), and the
    run's ``config.yaml`` and checkpoint record it."""
    import yaml

    from her_agents.cli import train_main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("checkpoint.pt", "config.yaml", "metrics.csv"):
        (run_dir / name).write_bytes((OLD_RUN / name).read_bytes())
    before = load_checkpoint(run_dir)["agent"]
    assert before["critic_optim"]["param_groups"][0]["lr"] == 1e-3
    # the checkpoint has no replay file: updates resume once the replay holds a batch again
    assert train_main(["--resume", str(run_dir), "train.total_env_steps=200", "train.eval_every=100",
                       "agent.critic_lr=3e-4", "agent.actor_weight_decay=0.01"]) == 0
    state = load_checkpoint(run_dir)
    assert state["agent"]["num_updates"] > before["num_updates"]  # updates ran after the resume
    (critic,) = state["agent"]["critic_optim"]["param_groups"]
    (actor,) = state["agent"]["actor_optim"]["param_groups"]
    assert (critic["lr"], critic["weight_decay"]) == (3e-4, 0.0)
    assert (actor["lr"], actor["weight_decay"], actor["decoupled_weight_decay"]) == (1e-3, 0.01, True)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["agent"]
    assert (saved["critic_lr"], saved["actor_weight_decay"]) == (3e-4, 0.01)
    assert state["config"]["agent"]["critic_lr"] == 3e-4


def test_write_atomic_refuses_a_path_that_is_not_a_regular_file(tmp_path):
    from her_agents.run.checkpoint import write_atomic

    fifo = tmp_path / "checkpoint.pt"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="got a FIFO, which the rename would replace"):
        write_atomic(fifo, lambda f: f.write(b"x"))
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]

"""Every bad input to ``her-train`` is one line naming the key, what was expected and what came, with nothing
written or deleted. In-process ``train_main`` calls: config errors stop before any env."""

from __future__ import annotations

import csv
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from her_agents.cli import train_main
from her_agents.config import load_config
from her_agents.loop.train import train
from her_agents.run.checkpoint import load_checkpoint

TINY = ["train.warmup_steps=50", "train.learning_starts=50", "train.eval_episodes=1", "env.eval_envs=1",
        "agent.hidden=[16]", "train.batch_size=16", "replay.capacity=3000", "log.progress=false",
        "log.wandb.mode=disabled"]


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    code = train_main(argv)
    err = capsys.readouterr().err
    return code, err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("her-train: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("override, expect", [
    ("train.total_env_steps=1e5", "train.total_env_steps must be an integer, got '1e5' (float)"),
    ("agent.actor_lr=fast", "agent.actor_lr must be a finite number, got 'fast' (str)"),
    ("agent.hidden=64", "agent.hidden must be a list of integers, got 64 (int)"),
    ("agent.hidden=[]", "agent.hidden must be a non-empty list of positive integers"),
    ("env.eval_envs=0", "env.eval_envs must be >= 1, got 0"),
    ("agent.noise_std=-1", "agent.noise_std must be >= 0, got -1"),
    ("train.warmup_steps=-5", "train.warmup_steps must be >= 0, got -5"),
    ("log.wandb.tags=a", "log.wandb.tags must be a list of strings, got 'a'"),
    ("replay.beta0=2", "replay.beta0 must be in [0, 1], got 2.0"),
    ("agent.layer_norm=3", "agent.layer_norm must be true or false, got 3 (int)"),
    ("replay.prioritized=2", "replay.prioritized must be true or false, got '2' (int)"),
    ("log.save_replay=1", "log.save_replay must be true or false, got '1' (int)"),
    ("replay.stop_at_success=0", "replay.stop_at_success must be true or false, got '0' (int)"),
    ("train.seed=", "train.seed must be an integer, got an empty value"),
    ("train.nonsense=1", "unknown key 'train.nonsense'; valid keys: env.id"),
    ("trian.seed=1", "unknown key 'trian' (did you mean train?); valid keys: env.id"),
    ("agent.hiden=64", "unknown key 'agent.hiden' for algo 'ddpg' (did you mean agent.hidden?); valid agent keys: action_l2"),
    ("agent.device=cuda", "agent.device is set by the training loop: use train.device"),
    ("agent.seed=5", "agent.seed is set by the training loop: use train.seed"),
    ("train.seed=-1", "train.seed must be in [0, 2**32 - 10000), got -1"),
    ("replay.strategy=bogus", "replay.strategy must be one of ['future', 'final', 'episode', 'mixed'], got 'bogus'"),
    ("replay.other_desired_fraction=2", "replay.other_desired_fraction must be a number in [0, 1], got 2.0"),
    ("agent.precision=fp16", "agent.precision must be one of ['fp32', 'bf16', 'auto'], got 'fp16' (str)"),
    ("agent.alpha=0.1", "unknown key 'agent.alpha' for algo 'ddpg'; valid agent keys: action_l2, actor_lr"),
    ("env.vectorization=threads", "env.vectorization must be one of ['sync', 'async'], got 'threads' (str)"),
    ("train.device=gpu", "train.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("train=5", "train must be a mapping of train.* keys, got '5' (int)"),
    ("log.wandb=offline", "log.wandb must be a mapping of log.wandb.* keys, got 'offline' (str)"),
    ("agent.target_update_interval=0", "agent.target_update_interval must be >= 1 in her-train (0 leaves the target "
                                       "updates to a loop of your own; this one never makes them), got 0"),
    ("train.learning_starts=20000", "train.learning_starts must be below train.total_env_steps (10000), else no "
                                    "update runs, got 20000"),
])
def test_bad_override_is_one_line_naming_key_expected_and_got(tmp_path, capsys, override, expect):
    code, err = _run(capsys, ["fetch_reach_ddpg", override, f"log.run_dir={tmp_path / 'run'}"])
    assert code == 2
    assert expect in _one_error_line(err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, expect", [
    ("train:\n  seed: [1,\n", "got text that does not parse (did not find expected node content at line 3"),
    ("- train.seed=1\n- algo=td3\n", "expected a YAML mapping of settings (key: value), got a list"),
    ("train:\n\tseed: 1\n", "YAML does not allow tabs for indentation"),
    ("", "got an empty file"),
    ("# nothing here\n", "got an empty file"),
    ("42\n", "expected a YAML mapping of settings (key: value), got int"),
    ("env_steps,episodes\n100,2\n", "expected a YAML mapping of settings (key: value), got plain text "
                                     "('env_steps,episodes')"),  # e.g. a metrics.csv given as the config
])
def test_bad_yaml_file_is_one_line(tmp_path, capsys, text, expect):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    code, err = _run(capsys, [str(path)])
    assert code == 2
    line = _one_error_line(err)
    assert f"config {path}: " in line and expect in line, line


@pytest.mark.parametrize("value, expect", [
    ("foo", "WANDB_MODE must be online, offline or disabled (or unset: log.wandb.mode decides), got 'foo'"),
    ("Offline", "got 'Offline'"),
])
def test_wandb_mode_env_that_wandb_refuses_is_one_line_before_anything_starts(tmp_path, capsys, monkeypatch,
                                                                             value, expect):
    # W&B validates WANDB_MODE at every wandb.init: the run used to go on without W&B after minutes of retries
    monkeypatch.setenv("WANDB_MODE", value)
    code, err = _run(capsys, ["fetch_reach_ddpg", f"log.run_dir={tmp_path / 'run'}"])
    assert code == 2 and expect in _one_error_line(err), err
    assert not (tmp_path / "run").exists()


def test_empty_wandb_mode_env_means_unset(monkeypatch):
    from her_agents.run.logger import wandb_mode

    monkeypatch.setenv("WANDB_MODE", "")
    assert wandb_mode("disabled") == "disabled"
    assert "WANDB_MODE" not in os.environ  # W&B itself refuses an empty WANDB_MODE
    monkeypatch.setenv("WANDB_MODE", "run")
    assert wandb_mode("disabled") == "online"


def test_print_config_takes_overrides(capsys):
    assert train_main(["fetch_reach_ddpg", "--print-config", "train.seed=7", "algo=td3"]) == 0
    out = capsys.readouterr().out
    assert "seed: 7" in out and "algo: td3" in out and "id: FetchReach-v4" in out


def test_unwritable_run_dir_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code, err = _run(capsys, ["fetch_reach_ddpg", f"log.run_dir={blocker / 'run'}", *TINY])
    assert code == 2
    line = _one_error_line(err)
    assert f"log.run_dir: cannot create {blocker / 'run'}" in line and "Not a directory" in line, line
    code, err = _run(capsys, ["fetch_reach_ddpg", f"log.run_dir={blocker}", *TINY])
    assert code == 2
    assert _one_error_line(err) == f"her-train: error: log.run_dir: {blocker} exists and is not a directory"


def test_cuda_device_without_cuda_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = _run(capsys, ["fetch_reach_ddpg", "train.device=cuda", f"log.run_dir={tmp_path / 'run'}", *TINY])
    assert code == 2
    line = _one_error_line(err)
    assert "train.device must be a device this machine has" in line and "got 'cuda'" in line, line
    assert not (tmp_path / "run").exists()


def test_replay_too_large_for_memory_is_one_line(tmp_path, capsys, monkeypatch):
    import her_agents.loop.start

    def no_memory(*args, **kwargs):  # what numpy raises for replay.capacity=1000000000000
        raise MemoryError("Unable to allocate 89.1 TiB for an array with shape (1000000000000, 25)")

    monkeypatch.setattr(her_agents.loop.start, "build_replay", no_memory)
    code, err = _run(capsys, ["fetch_reach_ddpg", f"log.run_dir={tmp_path / 'run'}", *TINY])
    assert code == 2
    line = _one_error_line(err)
    assert "out of memory (Unable to allocate 89.1 TiB" in line and "lower replay.capacity (now 3000)" in line, line


def test_networks_too_large_for_memory_are_one_line_naming_agent_hidden(tmp_path, capsys):
    """A real allocation: two 200000-unit layers ask torch's CPU allocator for 149 GiB at once (it was an
    allocator traceback)."""
    code, err = _run(capsys, ["fetch_reach_ddpg", f"log.run_dir={tmp_path / 'run'}", *TINY,
                              "agent.hidden=[200000,200000]"])
    assert code == 2
    assert _one_error_line(err) == ("her-train: error: agent.hidden=[200000, 200000]: the networks do not fit in "
                                    "memory (torch asked for 149.0 GiB on the CPU at once for one layer): use "
                                    "smaller layers")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("exc, asked", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 17179869184 bytes. Error code 12 (Cannot allocate memory)"), "16.0 GiB on the CPU"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.1 GiB"),
     "20.00 GiB on the GPU"),
])
def test_out_of_memory_in_the_updates_is_one_line_naming_batch_size_and_hidden(tmp_path, capsys, monkeypatch, exc,
                                                                                asked):
    import her_agents.loop.steps

    def no_memory(*args, **kwargs):  # a batch too large for the device, at the first update
        raise exc

    monkeypatch.setattr(her_agents.loop.steps, "learn_step", no_memory)
    code, err = _run(capsys, ["fetch_reach_ddpg", "train.total_env_steps=200", f"log.run_dir={tmp_path / 'run'}",
                              *TINY])
    assert code == 2
    assert _one_error_line(err) == (f"her-train: error: out of memory: torch asked for {asked}; lower "
                                    "train.batch_size (now 16) or agent.hidden (now [16])")


@pytest.mark.parametrize("args, expect", [
    (["--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    (["--device", "cuda"], "--device must be a device this machine has (auto or cpu: CUDA is not available), got 'cuda'"),
    (["--episodes", "0"], "her-eval: error: --episodes must be >= 1, got 0"),
    (["--video-episodes", "-2"], "her-eval: error: --video-episodes must be >= 1, got -2"),
    (["--seed", "-1"], "her-eval: error: --seed must be >= 0, got -1"),
    (["--episodes", "99999999999999999999"], "her-eval: error: --episodes must be at most 1000000, got "
                                             "99999999999999999999"),
    (["--seed", "99999999999999999999"], "her-eval: error: --seed must be below 2**32 - 10000, got "
                                         "99999999999999999999"),
])
def test_her_eval_bad_argument_is_one_line(finished_run, capsys, monkeypatch, args, expect):
    from her_agents.cli import eval_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        eval_main([str(finished_run), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expect in err and "usage" not in err, err  # no usage text


class _FullDisk:
    """A file whose writes fail once 1 KB is written, as on a full disk: ``torch.save`` then raises its own
    RuntimeError ("[enforce fail at inline_container.cc...]") with this OSError as its context."""

    def __init__(self, f) -> None:
        self.f, self.n = f, 0

    def write(self, b) -> int:
        if self.n > 1024:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.n += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def _fill_disk_at_save(monkeypatch, n: int) -> None:
    """The n-th and later ``torch.save`` calls hit a full disk."""
    real, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(1)
        return real(obj, _FullDisk(f) if len(calls) >= n else f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def _csv_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(float(r["env_steps"])) for r in csv.DictReader(f)]


def test_full_disk_is_one_line_keeps_only_covered_rows_and_resumes_once_freed(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    _fill_disk_at_save(monkeypatch, 2)  # the checkpoint at 200 env steps
    code, err = _run(capsys, ["fetch_reach_ddpg", "train.total_env_steps=300", "train.eval_every=100",
                              f"log.run_dir={run_dir}", *TINY])
    assert code == 1
    assert _one_error_line(err) == (f"her-train: error: cannot write {run_dir / 'checkpoint.pt'}: No space left on "
                                    f"device; free space, then continue with `her-train --resume {run_dir}`")
    assert load_checkpoint(run_dir / "checkpoint.pt")["counters"]["env_steps"] == 100
    assert _csv_steps(run_dir) == [100]  # the row of 200 had no checkpoint: cut back
    assert not list(run_dir.glob("*.tmp"))
    monkeypatch.undo()  # space freed
    code, err = _run(capsys, ["--resume", str(run_dir)])
    assert code == 0, err
    assert load_checkpoint(run_dir / "checkpoint.pt")["counters"]["env_steps"] == 300
    assert _csv_steps(run_dir) == [100, 200, 300]


def test_full_disk_at_the_first_checkpoint_leaves_no_row_and_says_to_start_again(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    _fill_disk_at_save(monkeypatch, 1)
    code, err = _run(capsys, ["fetch_reach_ddpg", "train.total_env_steps=200", "train.eval_every=100",
                              f"log.run_dir={run_dir}", *TINY])
    assert code == 1
    assert _one_error_line(err) == (f"her-train: error: cannot write {run_dir / 'checkpoint.pt'}: No space left on "
                                    "device; free space, then start the run again (no checkpoint was written yet)")
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "config.yaml"]


def test_full_disk_while_writing_metrics_csv_leaves_no_partial_row(tmp_path, capsys, monkeypatch):
    import her_agents.run.logger

    run_dir = tmp_path / "run"
    real_open, opened = open, []

    def full_open(file, mode="r", *args, **kwargs):  # the first append to metrics.csv writes part of a row
        f = real_open(file, mode, *args, **kwargs)
        if mode == "a" and not opened:
            opened.append(1)
            f.write("100,2,")
            f.flush()
            f.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return f

    monkeypatch.setattr(her_agents.run.logger, "open", full_open, raising=False)
    code, err = _run(capsys, ["fetch_reach_ddpg", "train.total_env_steps=200", "train.eval_every=100",
                              f"log.run_dir={run_dir}", *TINY])
    assert code == 1
    assert _one_error_line(err) == (f"her-train: error: cannot write {run_dir / 'metrics.csv'}: No space left on "
                                    "device; free space, then start the run again (no checkpoint was written yet)")
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "config.yaml"]  # no row cut short


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A 100-step FetchReach run with its replay saved."""
    run_dir = tmp_path_factory.mktemp("done") / "run"
    train(load_config("fetch_reach_ddpg", ["train.total_env_steps=100", "train.eval_every=100",
                                           "log.save_replay=true", f"log.run_dir={run_dir}", *TINY]))
    return run_dir


def test_run_dir_config_holds_the_full_agent_section(finished_run):
    saved = yaml.safe_load((finished_run / "config.yaml").read_text())["agent"]
    assert saved["hidden"] == [16] and saved["actor_lr"] == 0.001 and saved["action_l2"] == 1.0
    assert "seed" not in saved and "q_clip" not in saved  # the loop's train.seed; q_clip from the env
    assert load_checkpoint(finished_run / "checkpoint.pt")["config"]["agent"]["precision"] == "fp32"


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(run_dir, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


@pytest.mark.parametrize("args, expect", [
    (["fetch_reach_ddpg"], "continues the run with its own config: drop the config 'fetch_reach_ddpg'"),
    (["log.run_dir=/tmp/elsewhere"], "log.run_dir cannot be set with --resume"),
    (["env.id=FetchPush-v4"], "env.id cannot change on --resume: the run has 'FetchReach-v4', got 'FetchPush-v4'"),
    (["algo=td3"], "algo cannot change on --resume: the run has 'ddpg', got 'td3'"),
    (["agent.hidden=[32,32]"], "agent.hidden cannot change on --resume: the run has [16], got [32, 32]"),
    (["--overwrite"], "--overwrite starts a fresh run; it cannot be combined with --resume"),
    (["train.total_env_steps=50"], "train.total_env_steps must be above the 100 env steps the run in"),
    (["log.progress=1"], "log.progress must be true or false, got '1' (int)"),
])
def test_resume_refuses_what_cannot_change(finished_run, tmp_path, capsys, args, expect):
    run_dir = _copy(finished_run, tmp_path)
    before = sorted(p.name for p in run_dir.iterdir())
    code, err = _run(capsys, ["--resume", str(run_dir), *args])
    assert code == 2
    assert expect in _one_error_line(err)
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_resume_of_the_checkpoint_file_names_the_run_directory(finished_run, tmp_path, capsys):
    run_dir = _copy(finished_run, tmp_path)
    code, err = _run(capsys, ["--resume", str(run_dir / "checkpoint.pt")])
    assert code == 2
    line = _one_error_line(err)
    assert f"--resume takes the run directory, got the file {run_dir / 'checkpoint.pt'}: use --resume {run_dir}" \
        in line, line


@pytest.mark.parametrize("argv, expect", [
    (["--resume"], "argument --resume: expected one argument"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_her_train_argument_error_is_one_line_without_usage(capsys, argv, expect):
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert expect in _one_error_line(err) and "usage" not in err, err


def test_resume_accepts_steps_logging_and_eval_overrides(finished_run, tmp_path, capsys):
    run_dir = _copy(finished_run, tmp_path)
    code = train_main(["--resume", str(run_dir), "train.total_env_steps=150", "train.eval_every=50",
                       "train.eval_episodes=2", "env.eval_envs=2", "log.progress=false"])
    assert code == 0, capsys.readouterr().err
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["counters"]["env_steps"] == 150
    assert state["config"]["train"]["eval_every"] == 50


@pytest.mark.parametrize("victim", ["checkpoint.pt", "replay.npz", "replay-100.log"])
def test_resume_with_a_truncated_file_is_one_line(finished_run, tmp_path, capsys, victim):
    run_dir = _copy(finished_run, tmp_path)
    data = (run_dir / victim).read_bytes()
    (run_dir / victim).write_bytes(data[: len(data) // 2])
    code, err = _run(capsys, ["--resume", str(run_dir), "train.total_env_steps=200"])
    assert code == 2
    line = _one_error_line(err)
    kind = {"checkpoint.pt": "checkpoint", "replay.npz": "replay", "replay-100.log": "replay log"}[victim]
    assert f"{kind} {run_dir / victim} cannot be read" in line and "truncated or corrupt" in line, line


def test_print_config_into_a_pipe_closed_early_ends_quietly():
    # `her-train --print-config | head -1`: the reader closes the pipe before the config is written out
    proc = subprocess.Popen([sys.executable, "-m", "her_agents.cli", "--print-config"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()[-2000:]


@pytest.mark.parametrize("args, expect", [
    (["{run}", "--episodes", "0"], "--episodes must be >= 1, got 0"),
    (["{run}", "--seed", "-3"], "--seed must be >= 0, got -3"),
    (["{run}/nothing_here"], "no checkpoint at"),
    (["{run}"], "is a FetchReach-v4 run, not FetchSlide"),
])
def test_analysis_script_bad_argument_is_one_line(finished_run, capsys, args, expect):
    from her_agents.tools import checkpoint_analysis

    with pytest.raises(SystemExit) as exc:
        checkpoint_analysis("doc", "FetchSlide", 10, [a.format(run=finished_run) for a in args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and expect in err.strip().splitlines()[-1], err


def test_analysis_script_loads_the_checkpoint_and_its_agent(finished_run):
    from her_agents.tools import checkpoint_analysis

    args, state, agent = checkpoint_analysis("doc", "FetchReach", 10, [str(finished_run), "--seed", "7"])
    assert (args.episodes, args.seed) == (10, 7) and state["counters"]["env_steps"] == 100
    saved = state["agent"]["actor"]
    loaded = agent.actor.state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)


def test_print_config_of_a_complete_run_shows_what_the_resume_would_use(finished_run, capsys):
    assert train_main(["--resume", str(finished_run), "--print-config", "train.eval_episodes=3"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["train"]["total_env_steps"] == 100 and cfg["train"]["eval_episodes"] == 3
    assert cfg["env"]["id"] == "FetchReach-v4"


@pytest.mark.parametrize("override", ["log.run_dir=", "log.run_dir=''", "log.run_dir= "])
def test_empty_run_dir_is_refused_like_an_empty_env_id(capsys, override):
    code, err = _run(capsys, ["fetch_reach_ddpg", override, *TINY])
    assert code == 2
    assert _one_error_line(err) == ("her-train: error: log.run_dir must be a directory path, got an empty value; "
                                    "leave log.run_dir out for the default runs/<env>-<algo>-s<seed>-<time>")


@pytest.mark.parametrize("env_id, expect", [
    ("FetchReach-v1", "her-train: error: env id 'FetchReach-v1' is an old version that needs mujoco_py, which is "
                      "not installed (nor supported here): use FetchReach-v4, the same task on the maintained "
                      "mujoco bindings"),
    ("FetchPickAndPlaceDense-v1", "use FetchPickAndPlaceDense-v4"),
    ("FetchPush-v2", "Did you mean: FetchPush-v4, FetchPushDense-v4"),
])
def test_old_or_unknown_env_id_is_one_line_offering_only_ids_that_build(tmp_path, capsys, env_id, expect):
    import importlib.util

    if importlib.util.find_spec("mujoco_py") is not None:
        pytest.skip("mujoco_py is installed: the -v1 ids build")
    code, err = _run(capsys, ["fetch_reach_ddpg", f"env.id={env_id}", f"log.run_dir={tmp_path / 'run'}", *TINY])
    assert code == 2
    line = _one_error_line(err)
    assert expect in line and "-v1," not in line and "-v1?" not in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["under_a_file", "read_only_dir", "a_directory"])
def test_her_eval_video_that_cannot_be_written_is_refused_before_the_evaluation(finished_run, tmp_path, capsys,
                                                                                monkeypatch, where):
    import os

    import her_agents.loop.train
    from her_agents.cli import eval_main

    if where == "under_a_file":
        (tmp_path / "a_file").write_text("")
        video, named = tmp_path / "a_file" / "sub" / "v.mp4", f"{tmp_path / 'a_file'} (Not a directory)"
    elif where == "read_only_dir":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        video, named = ro / "v.gif", f"{ro} (Permission denied)"
    else:
        video, named = tmp_path / "dir.mp4", f"{tmp_path / 'dir.mp4'} (Is a directory)"
        video.mkdir()

    def no_evaluation(*args, **kwargs):
        raise AssertionError("the evaluation ran before the video path was checked")

    monkeypatch.setattr(her_agents.loop.train, "evaluate", no_evaluation)
    assert eval_main([str(finished_run), "--video", str(video)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"her-eval: error: --video {video}: cannot write {named}", err


def test_agent_from_checkpoint_gets_the_loops_derived_q_clip(finished_run):
    from her_agents.algos.registry import agent_from_checkpoint

    state = load_checkpoint(finished_run)
    assert "q_clip" not in state["config"]["agent"]
    assert agent_from_checkpoint(state).config.q_clip == (-50.0, 0.0)  # FetchReach, gamma 0.98, as in training

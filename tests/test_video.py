"""Headless evaluation videos: ``her-eval CHECKPOINT --video out.mp4|out.gif`` with MUJOCO_GL=egl / osmesa, and
clear messages (never a traceback, never a stopped training) when no OpenGL backend works.

Every subprocess gets its own ``MUJOCO_GL``: MuJoCo reads it when it is first imported. ``DISPLAY`` is removed so
``glfw`` cannot open a window, as on a headless server.
"""

from __future__ import annotations

import csv
import ctypes.util
import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import pytest

from her_agents.config import load_config
from her_agents.loop.train import train

EPISODE_STEPS = 50  # FetchReach-v4 time limit: each episode renders its reset frame plus one per step
SIZE = (480, 480)
HAVE = {"egl": ctypes.util.find_library("EGL"), "osmesa": ctypes.util.find_library("OSMesa")}
INSTALL = {"egl": "libegl1 libegl-mesa0", "osmesa": "libosmesa6"}


def _env(gl: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY", "PYOPENGL_PLATFORM")}
    env["WANDB_MODE"] = "offline"
    if gl is not None:
        env["MUJOCO_GL"] = gl
    return env


def _her_eval(*args: str, gl: str | None) -> subprocess.CompletedProcess:
    code = f"import sys; from her_agents.cli import eval_main; sys.exit(eval_main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(gl), timeout=300,
                          check=False)


def _needs(gl: str) -> None:
    if not HAVE[gl]:
        pytest.skip(f"MUJOCO_GL={gl} needs lib{'EGL' if gl == 'egl' else 'OSMesa'} (Debian: {INSTALL[gl]}), "
                    "not found by ctypes.util.find_library")


def _read_frames(path: Path) -> list:
    reader = imageio.get_reader(path)
    try:
        return [f for f in reader]
    finally:
        reader.close()


@pytest.fixture(scope="module")
def reach_checkpoint(tmp_path_factory) -> Path:
    """A FetchReach-v4 DDPG checkpoint after 200 env steps (a barely trained policy is enough to film)."""
    run_dir = tmp_path_factory.mktemp("video") / "run"
    train(load_config("fetch_reach_ddpg", [
        "train.total_env_steps=200", "train.eval_every=200", "train.warmup_steps=100", "train.learning_starts=100",
        "train.eval_episodes=2", "env.eval_envs=2", "agent.hidden=[64,64]", "train.batch_size=64",
        f"log.run_dir={run_dir}", "log.progress=false", "log.wandb.mode=disabled"]))
    return run_dir / "checkpoint.pt"


def _check_report(stdout: str, episodes: int) -> None:
    m = re.search(r"success rate (\d\.\d+) over (\d+) episodes?, mean final distance (\d+\.\d+)", stdout)
    assert m, stdout
    assert 0.0 <= float(m.group(1)) <= 1.0 and int(m.group(2)) == episodes and float(m.group(3)) >= 0.0


# Both backends with mp4 (2 episodes); the GIF writer once (1 episode: encoding a GIF is slow on a busy CPU).
@pytest.mark.parametrize("gl, ext, episodes", [("egl", "mp4", 2), ("osmesa", "mp4", 2), ("egl", "gif", 1)])
def test_her_eval_writes_video_with_one_frame_per_step(reach_checkpoint, tmp_path, gl, ext, episodes):
    _needs(gl)
    out = tmp_path / f"reach.{ext}"
    proc = _her_eval(str(reach_checkpoint), "--episodes", "2", "--video", str(out), "--video-episodes",
                     str(episodes), gl=gl)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_report(proc.stdout, 2)
    frames = _read_frames(out)
    assert len(frames) == episodes * (EPISODE_STEPS + 1), (len(frames), proc.stdout)
    assert {f.shape[:2] for f in frames} == {SIZE}
    assert f"{len(frames)} frames, 480x480" in proc.stdout


def test_her_eval_video_without_mujoco_gl_defaults_to_a_headless_backend(reach_checkpoint, tmp_path):
    """MUJOCO_GL unset, no display: her-eval picks egl, so the video works (or says clearly why not)."""
    out = tmp_path / "reach.mp4"
    proc = _her_eval(str(reach_checkpoint), "--episodes", "2", "--video", str(out), "--video-episodes", "1",
                     gl=None)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if HAVE["egl"]:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(_read_frames(out)) == EPISODE_STEPS + 1
    else:
        assert proc.returncode == 1 and "her-eval: no video" in proc.stderr


def test_her_eval_with_unknown_gl_backend_gives_clear_error(reach_checkpoint, tmp_path):
    proc = _her_eval(str(reach_checkpoint), "--episodes", "2", "--video", str(tmp_path / "x.mp4"), gl="nonsense")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "MUJOCO_GL='nonsense' is not a MuJoCo OpenGL backend" in proc.stderr, proc.stderr[-3000:]
    assert "egl" in proc.stderr and "osmesa" in proc.stderr
    assert not (tmp_path / "x.mp4").exists()


def test_her_eval_with_broken_gl_backend_reports_and_still_evaluates(reach_checkpoint, tmp_path):
    """glfw without a display cannot make a GL context: the evaluation is reported, the video refused clearly."""
    proc = _her_eval(str(reach_checkpoint), "--episodes", "2", "--video", str(tmp_path / "x.gif"), gl="glfw")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "her-eval: no video: cannot render FetchReach-v4 with MUJOCO_GL='glfw'" in proc.stderr
    assert "libosmesa6" in proc.stderr  # says what to install
    _check_report(proc.stdout, 2)
    assert not (tmp_path / "x.gif").exists()


def _train_with_video(run_dir: Path, gl: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "her_agents.cli", "fetch_reach_ddpg", "train.total_env_steps=200", "train.eval_every=100",
         "train.warmup_steps=100", "train.learning_starts=100", "train.eval_episodes=2", "env.eval_envs=2",
         "agent.hidden=[64,64]", "train.batch_size=64", "log.video_every=1", "log.wandb.mode=offline",
         "log.wandb.init_timeout_s=600",  # a loaded CI runner may take minutes to start W&B's service
         f"log.run_dir={run_dir}", "log.progress=false"],
        capture_output=True, text=True, env=_env(gl), timeout=900, check=False)


def test_training_goes_on_when_video_rendering_fails(tmp_path):
    proc = _train_with_video(tmp_path / "run", gl="glfw")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert out.count("video skipped") == 1, out[-3000:]  # said once, not at every evaluation
    assert "cannot render FetchReach-v4 with MUJOCO_GL='glfw'" in out
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        assert [int(r["env_steps"]) for r in csv.DictReader(f)] == [100, 200]
    assert not glob.glob(str(tmp_path / "run" / "videos" / "*"))


def test_training_logs_eval_videos_to_run_dir_and_wandb(tmp_path):
    _needs("egl")
    proc = _train_with_video(tmp_path / "run", gl="egl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "video skipped" not in proc.stdout + proc.stderr
    videos = sorted(glob.glob(str(tmp_path / "run" / "videos" / "eval_*.mp4")))
    assert [Path(v).name for v in videos] == ["eval_000000100.mp4", "eval_000000200.mp4"]
    assert len(_read_frames(Path(videos[0]))) == EPISODE_STEPS + 1
    logged = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / "files" / "media" / "videos" / "eval"
                           / "*.mp4"))
    assert len(logged) == 2, (logged, [line for line in (proc.stdout + proc.stderr).splitlines() if "W&B" in line])


# A backend whose library is missing, without uninstalling it: PyOpenGL looks the library up by this name.
_HIDE_OSMESA = ("import sys, ctypes.util; real = ctypes.util.find_library; "
                "ctypes.util.find_library = lambda n: None if n == 'OSMesa' else real(n); ")


def _cli_with_missing_osmesa(main: str, args: list[str]) -> subprocess.CompletedProcess:
    code = _HIDE_OSMESA + f"from her_agents.cli import {main}; sys.exit({main}({args!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env("osmesa"),
                          timeout=600, check=False)


def test_a_missing_gl_library_stops_no_run_that_renders_nothing(reach_checkpoint, tmp_path):
    """MUJOCO_GL=osmesa without libOSMesa: her-train and her-eval without a video never load it (they crashed
    with a PyOpenGL traceback at `import mujoco`)."""
    proc = _cli_with_missing_osmesa("eval_main", [str(reach_checkpoint), "--episodes", "2"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    _check_report(proc.stdout, 2)
    proc = _cli_with_missing_osmesa("train_main", [
        "fetch_reach_ddpg", "train.total_env_steps=100", "train.eval_every=100", "train.warmup_steps=50",
        "train.learning_starts=50", "train.eval_episodes=1", "env.eval_envs=1", "agent.hidden=[16]",
        "train.batch_size=16", "log.wandb.mode=disabled", "log.progress=false", f"log.run_dir={tmp_path / 'run'}"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_missing_gl_library_for_a_video_is_one_line_saying_what_to_install(reach_checkpoint, tmp_path):
    expected = ("MUJOCO_GL=osmesa: libOSMesa is not installed, and the video needs it: install libosmesa6 "
                "(Debian/Ubuntu; mesa-libOSMesa on Fedora), or use MUJOCO_GL=egl")
    proc = _cli_with_missing_osmesa("eval_main", [str(reach_checkpoint), "--video", str(tmp_path / "x.mp4")])
    assert proc.returncode == 2 and proc.stderr == f"her-eval: error: {expected}\n", proc.stderr[-3000:]
    proc = _cli_with_missing_osmesa("train_main", ["fetch_reach_ddpg", "log.video_every=1",
                                                   f"log.run_dir={tmp_path / 'run'}"])
    assert proc.returncode == 2 and proc.stderr == f"her-train: error: {expected}\n", proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_glx_for_a_video_is_one_line(reach_checkpoint, tmp_path):
    """MuJoCo knows glx, gymnasium's renderer does not: refused before the evaluation (it was a RuntimeError
    inside the renderer and an ignored AttributeError traceback)."""
    proc = _her_eval(str(reach_checkpoint), "--video", str(tmp_path / "x.mp4"), gl="glx")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == ("her-eval: error: MUJOCO_GL=glx: gymnasium renders MuJoCo with glfw, egl or osmesa only: "
                           "use MUJOCO_GL=egl headless (libegl1) or MUJOCO_GL=glfw with a display\n")


def test_an_mp4_that_ffmpeg_leaves_incomplete_is_an_error_not_a_written_video(tmp_path, monkeypatch):
    # on a full disk ffmpeg reports its lost trailer only on stderr: mimsave returns, the file is a stub
    import numpy as np

    from her_agents.run import video

    def stub(path, frames, **kwargs):
        Path(path).write_bytes(b"\0" * 4096)

    monkeypatch.setattr(imageio, "mimsave", stub)
    out = tmp_path / "v.mp4"
    with pytest.raises(OSError, match=r"incomplete video \(0 of 3 frames\)"):
        video.write_video(out, np.zeros((3, 16, 16, 3), np.uint8))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the stub nor a temp file is left
    monkeypatch.undo()
    video.write_video(out, np.zeros((3, 16, 16, 3), np.uint8))
    assert imageio.get_reader(out).count_frames() == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]

"""Headless evaluation videos (MuJoCo rendering with ``MUJOCO_GL=egl`` or ``osmesa``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["record_episodes", "write_video"]


def record_episodes(agent: Any, env_id: str, n_episodes: int = 1, seed: int = 0) -> tuple[np.ndarray, list[bool]]:
    """Render ``n_episodes`` deterministic episodes.

    Returns:
        frames: uint8 [N, H, W, 3]; successes: ``info["is_success"]`` at each episode's end.
    Raises:
        RuntimeError: no usable OpenGL backend (message says which MUJOCO_GL to set and what to install).
    """
    if not os.environ.get("MUJOCO_GL") and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"  # headless default; must be set before mujoco loads its GL context
    from envs import make_env

    try:
        env = make_env(env_id, seed=seed, render_mode="rgb_array")
        obs, _ = env.reset(seed=seed)
        frames = [env.render()]
    except Exception as exc:
        raise RuntimeError(
            f"cannot render {env_id} with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: {exc}. Install Debian's "
            "libegl1 libegl-mesa0 libgl1-mesa-dri (MUJOCO_GL=egl) or libosmesa6 (MUJOCO_GL=osmesa)"
        ) from exc
    successes = []
    for ep in range(n_episodes):
        if ep:
            obs, _ = env.reset(seed=seed + ep)
            frames.append(env.render())
        done = False
        while not done:
            action = agent.act(obs["observation"][None], obs["desired_goal"][None], deterministic=True)[0]
            obs, _, terminated, truncated, info = env.step(action)
            frames.append(env.render())
            done = terminated or truncated
        successes.append(bool(info.get("is_success", False)))
    env.close()
    return np.stack(frames).astype(np.uint8), successes


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: int = 25) -> None:
    """Write frames [N, H, W, 3] uint8 to an .mp4 (ffmpeg via imageio) or .gif."""
    import imageio.v2 as imageio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        imageio.mimsave(path, list(frames), duration=1000 / fps, loop=0)
    else:
        imageio.mimsave(path, list(frames), fps=fps, macro_block_size=1)

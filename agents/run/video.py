"""Headless evaluation videos (MuJoCo rendering with ``MUJOCO_GL=egl`` or ``osmesa``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["check_gl_backend", "default_headless_gl", "prepare_gl", "record_episodes", "write_video"]

_VALID_GL = ("egl", "osmesa", "glfw", "glx")
_INSTALL_HINT = ("Install Debian's libegl1 libegl-mesa0 libgl1-mesa-dri (MUJOCO_GL=egl) or libosmesa6 "
                 "(MUJOCO_GL=osmesa)")


def default_headless_gl() -> None:
    """Without a display, pick ``MUJOCO_GL=egl`` unless the user chose a backend (before MuJoCo renders)."""
    if not os.environ.get("MUJOCO_GL") and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"


def check_gl_backend() -> None:
    """Refuse an unknown ``MUJOCO_GL`` up front: ``import mujoco`` itself fails on one, with a bare RuntimeError.

    Raises:
        RuntimeError: ``MUJOCO_GL`` is set to something else than egl, osmesa, glfw or glx.
    """
    gl = os.environ.get("MUJOCO_GL", "").strip().lower()
    if gl and gl not in _VALID_GL + ("", "disable", "disabled", "off", "false", "0", "enable", "enabled", "on",
                                     "true", "1"):
        raise RuntimeError(f"MUJOCO_GL={gl!r} is not a MuJoCo OpenGL backend: use one of {', '.join(_VALID_GL)} "
                           f"(egl or osmesa without a display). {_INSTALL_HINT}")


_LIBRARIES = {"osmesa": (("OSMesa",),), "egl": (("EGL",), ("OpenGL", "GL")), "glx": (("OpenGL", "GL"),)}
"""The shared libraries PyOpenGL loads for each ``MUJOCO_GL`` backend (each entry: one of these names)."""
_PACKAGES = {"osmesa": "libosmesa6 (Debian/Ubuntu; mesa-libOSMesa on Fedora), or use MUJOCO_GL=egl",
             "egl": "libegl1 and libgl1 (with libegl-mesa0 libgl1-mesa-dri without an NVIDIA driver), or use "
                    "MUJOCO_GL=osmesa (libosmesa6)",
             "glx": "libgl1 and run with a display, or use MUJOCO_GL=egl (libegl1) headless",
             "glfw": "libglfw3 and run with a display, or use MUJOCO_GL=egl (libegl1) headless"}


def _loads(name: str) -> bool:
    path = ctypes.util.find_library(name)
    if path is None:
        return False
    try:
        ctypes.CDLL(path)
    except OSError:
        return False
    return True


def _missing_gl_library(gl: str) -> str | None:
    """The first library the backend ``gl`` needs that cannot be loaded, or None."""
    for names in _LIBRARIES.get(gl, ()):
        if not any(_loads(n) for n in names):
            return "lib" + names[-1]
    return None


def prepare_gl(video: bool) -> None:
    """Before MuJoCo loads (``import mujoco`` loads the OpenGL library of ``MUJOCO_GL`` at once): rendering
    libraries load only for a video.

    Without ``video``: a backend whose library is missing is switched off (``MUJOCO_GL=disable``), so that a
    run that renders nothing does not need it. With ``video``: a headless default (``default_headless_gl``),
    then the backend's library must load, and MuJoCo with it (a backend that loads but cannot render, e.g.
    glfw without a display, is reported where the video is made).

    Raises:
        RuntimeError: an unknown ``MUJOCO_GL`` (``check_gl_backend``); with ``video``, a backend library
            that is missing or that MuJoCo cannot load (the message says what to install).
    """
    check_gl_backend()
    if video:
        default_headless_gl()
    gl = os.environ.get("MUJOCO_GL", "").strip().lower()
    missing = _missing_gl_library(gl)
    if not video:
        if missing and "mujoco" not in sys.modules:
            os.environ["MUJOCO_GL"] = "disable"
        return
    if gl == "glx":  # MuJoCo knows it, gymnasium's renderer does not
        raise RuntimeError("MUJOCO_GL=glx: gymnasium renders MuJoCo with glfw, egl or osmesa only: use "
                           "MUJOCO_GL=egl headless (libegl1) or MUJOCO_GL=glfw with a display")
    if missing:
        raise RuntimeError(f"MUJOCO_GL={gl}: {missing} is not installed, and the video needs it: install "
                           f"{_PACKAGES[gl]}")
    try:
        import mujoco  # noqa: F401  (loads the backend's OpenGL library now, not in the middle of the run)
    except Exception as exc:
        hint = _PACKAGES.get(gl or "glfw", _INSTALL_HINT)
        raise RuntimeError(f"MUJOCO_GL={gl or '(unset)'}: MuJoCo cannot load its OpenGL library for the video "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): install "
                           f"{hint}") from None


def record_episodes(agent: Any, env_id: str, n_episodes: int = 1, seed: int = 0) -> tuple[np.ndarray, list[bool]]:
    """Render ``n_episodes`` deterministic episodes.

    Returns:
        frames: uint8 [N, H, W, 3]; successes: ``info["is_success"]`` at each episode's end.
    Raises:
        RuntimeError: no usable OpenGL backend (message says which MUJOCO_GL to set and what to install).
    """
    default_headless_gl()  # gymnasium reads MUJOCO_GL when the first frame is rendered
    check_gl_backend()
    from her_envs import make_env

    env = None
    try:
        env = make_env(env_id, seed=seed, render_mode="rgb_array")
        obs, _ = env.reset(seed=seed)
        frames: list[Any] = [env.render()]  # rgb_array mode: uint8 [H, W, 3] each
    except Exception as exc:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass
        raise RuntimeError(
            f"cannot render {env_id} with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: "
            f"{type(exc).__name__}: {exc}. {_INSTALL_HINT}"
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
    """Write frames [N, H, W, 3] uint8 to an .mp4 (ffmpeg via imageio) or .gif, every frame kept.

    Pillow's GIF writer merges a frame identical to the previous one into it (a policy holding still at the goal
    gives such frames); the GIF would then hold fewer frames than rendered, and a reader could not tell frames
    from steps. So in a GIF the top-left pixel alternates black and white from frame to frame: no two neighbours
    are equal and the GIF keeps one frame per rendered step.

    The video is written to a temp file beside ``path`` and renamed onto it once complete: ffmpeg reports a
    full disk at its trailer only on stderr, so the .mp4 is read back and must hold every frame.

    Raises:
        OSError: one line naming ``path``: a full disk (ENOSPC), an incomplete or unwritable file.
        ValueError: ``path`` exists and is not a regular file (a device, a FIFO).
    """
    import imageio.v2 as imageio

    from her._util import check_replaceable

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_replaceable(path)
    frames = np.asarray(frames, np.uint8)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        if path.suffix.lower() == ".gif":
            frames = frames.copy()
            frames[0::2, 0, 0, :] = 0
            frames[1::2, 0, 0, :] = 255
            imageio.mimsave(tmp, list(frames), duration=1000 / fps, loop=0)
        else:
            try:
                imageio.mimsave(tmp, list(frames), fps=fps, macro_block_size=1)
            except OSError as exc:  # ffmpeg's broken pipe, with its whole stderr in the message
                raise _video_error(path, f"ffmpeg stopped ({str(exc).splitlines()[0]})") from None
            written = _count_frames(tmp)
            if written != len(frames):
                raise _video_error(path, f"ffmpeg wrote an incomplete video ({written} of {len(frames)} frames)")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _count_frames(path: Path) -> int:
    """The frames an .mp4 holds as ffmpeg reads it back; 0 for a file it cannot read (no trailer)."""
    import imageio.v2 as imageio

    try:
        with imageio.get_reader(path, format="FFMPEG") as reader:
            return int(reader.count_frames())  # type: ignore[attr-defined]  # the FFMPEG reader's own method, not on the base type
    except (OSError, RuntimeError, ValueError, IndexError):
        return 0


def _video_error(path: Path, why: str) -> OSError:
    """ENOSPC where the disk of ``path`` is (nearly) full, else ``why``; one line naming ``path``."""
    import errno
    import shutil

    if shutil.disk_usage(path.parent).free < 1 << 20:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return OSError(errno.EIO, why, str(path))

"""Building goal envs by id: [`make_env`][her_envs.make.make_env] (one validated, wrapped env) and
[`goal_env_spec`][her_envs.make.goal_env_spec] (its spec).

Env ids are resolved against gymnasium's registry, registering gymnasium_robotics (and so loading MuJoCo) only
when an id needs it; unknown ids and old ones that need mujoco_py are refused with the ids to use instead.
An id of the form ``"module.path:EnvId-v0"`` (gymnasium's own convention) first imports ``module.path``, which
registers ``EnvId-v0``; the module is found on ``sys.path`` or, failing that, in the current directory, so a
goal env of your own trains without being installed as a package.
[`FETCH_TASKS`][her_envs.FETCH_TASKS] names the maintained Fetch tasks.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.util
import io
import os
import sys
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import parse_env_id

from .spec import GoalEnvSpec, spec_from_env
from .wrappers import wrap_goal_env

__all__ = ["FETCH_TASKS", "goal_env_spec", "make_env"]


FETCH_TASKS: tuple[str, ...] = ("FetchReach-v4", "FetchPush-v4", "FetchSlide-v4", "FetchPickAndPlace-v4")


def _buildable(env_id: str) -> bool:
    """False for a registered id whose env needs mujoco_py (gymnasium_robotics' ``-v1`` Fetch tasks, its
    ``MujocoPy*`` classes) where mujoco_py is not installed."""
    entry = gym.registry[env_id].entry_point
    return not (isinstance(entry, str) and ":MujocoPy" in entry and importlib.util.find_spec("mujoco_py") is None)


def _import_env_module(env_id: str) -> str:
    """For ``"module.path:EnvId-v0"``: import ``module.path`` (which registers ``EnvId-v0``) and return
    ``"EnvId-v0"``; any other id is returned as it is.

    The module is imported from ``sys.path`` or, when it is not there, from the current directory (console
    scripts such as ``her-train`` do not put it on ``sys.path`` as ``python`` does).

    Raises:
        ValueError: an empty module or id, a module that cannot be found or fails to import, an id the module
            did not register (naming the ones it did).
    """
    module, sep, name = env_id.partition(":")
    if not sep:
        return env_id
    module, name = module.strip(), name.strip()
    if not module or not name:
        raise ValueError(f"env id {env_id!r}: expected 'module.path:EnvId-v0' (a module that registers the env "
                         "with gymnasium.register, then the id it registers)")
    before = set(gym.registry)
    try:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            here = os.getcwd()
            if exc.name != module.split(".")[0] or here in sys.path:
                raise
            sys.path.append(here)  # `python` puts the current directory on sys.path; console scripts do not
            importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name != module and not module.startswith(exc.name + "."):
            raise ValueError(f"env id {env_id!r}: importing module {module!r} failed: it imports {exc.name!r}, "
                             "which is not installed") from None
        raise ValueError(f"env id {env_id!r}: no module named {module!r} on the Python path or in the current "
                         f"directory ({os.getcwd()}); add its folder to PYTHONPATH or run from it") from None
    except Exception as exc:  # the user's module itself fails: say where, in one line
        raise ValueError(f"env id {env_id!r}: importing module {module!r} raised {type(exc).__name__}: "
                         f"{exc}") from None
    except SystemExit as exc:  # a script's `sys.exit()` at import would end the run without a word
        raise ValueError(f"env id {env_id!r}: importing module {module!r} called sys.exit({exc.code!r}); a module "
                         "that registers envs must not exit at import (guard script code with "
                         "`if __name__ == \"__main__\":`)") from None
    if name not in gym.registry:
        mine = sorted((set(gym.registry) - before) | {
            i for i, spec in gym.registry.items()
            if isinstance(spec.entry_point, str) and spec.entry_point.split(":")[0].startswith(module)})
        got = f"it registers {', '.join(mine)}" if mine else "it registers no env (call gymnasium.register in it)"
        raise ValueError(f"env id {env_id!r}: module {module!r} did not register {name!r}: {got}")
    return name


def _resolve_env_id(env_id: str) -> str:
    """Make sure ``env_id`` is registered and can be built, importing gymnasium_robotics only if it is needed;
    returns the id to give ``gym.make`` (``"EnvId-v0"`` for ``"module.path:EnvId-v0"``, whose module it imports).

    Raises:
        ValueError: an unknown id (with the close registered ones), an old id that needs mujoco_py (with the
            maintained version of the task), a ``module:id`` whose module cannot be imported or did not register
            the id.
    """
    if not isinstance(env_id, str):
        raise TypeError(
            f"env_id must be a str such as 'FetchReach-v4', got {type(env_id).__name__}: {env_id!r}"
        )
    env_id = _import_env_module(env_id)
    if env_id in gym.registry and _buildable(env_id):
        return env_id
    try:
        # gymnasium-robotics prints a notice about its Adroit envs to stderr at import; it is not about Fetch.
        with contextlib.redirect_stderr(io.StringIO()):
            import gymnasium_robotics
    except ImportError:  # pragma: no cover - it is a dependency of the package
        gymnasium_robotics = None
    if gymnasium_robotics is not None:
        gym.register_envs(gymnasium_robotics)
    if env_id in gym.registry and _buildable(env_id):
        return env_id
    if env_id in gym.registry:  # e.g. FetchReach-v1: gym.make would end in DependencyNotInstalled
        ns, name, _ = parse_env_id(env_id)
        newer = sorted((spec.version or 0, i) for i, spec in gym.registry.items()
                       if (spec.namespace, spec.name) == (ns, name) and _buildable(i))
        use = f"use {newer[-1][1]}, the same task on the maintained mujoco bindings" if newer else "pick another env"
        raise ValueError(f"env id {env_id!r} is an old version that needs mujoco_py, which is not installed "
                         f"(nor supported here): {use}")
    usable = [i for i in dict.fromkeys([*FETCH_TASKS, *gym.registry]) if _buildable(i)]
    close = difflib.get_close_matches(env_id, usable, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ValueError(
        f"Unknown env id {env_id!r}: it is not registered with gymnasium (gymnasium_robotics included)."
        f"{hint} Fetch tasks: {', '.join(FETCH_TASKS)}."
    )


def make_env(env_id: str, seed: int | None = None, render_mode: str | None = None) -> gym.Env:
    """Build one goal env and check at set-up that HER can use it.

    Args:
        env_id: a registered gymnasium id, e.g. ``"FetchReach-v4"`` (gymnasium_robotics is registered lazily),
            or ``"module.path:EnvId-v0"``: ``module.path`` is imported first (from ``sys.path`` or the current
            directory) and registers ``EnvId-v0``.
        seed: if given, the env is reset once with ``seed`` and its action space is seeded with it; later
            ``reset()`` calls without a seed continue that stream, so the run is reproducible.
        render_mode: passed to ``gym.make`` (``"rgb_array"`` for frames; set ``MUJOCO_GL`` for headless).

    Returns:
        the env wrapped by [`wrap_goal_env`][her_envs.make.wrap_goal_env]: its action space is ``Box(-1, 1)``
        float32 (mapped onto the
        env's own bounds) and its observations are fresh arrays at every ``reset`` / ``step``.

    Raises:
        ValueError: unknown env id, or an old one that needs mujoco_py (names the version to use); a
            ``module:id`` whose module cannot be imported or does not register the id.
        TypeError: the observation space is not a Dict with ``observation``, ``achieved_goal`` and
            ``desired_goal`` 1-D boxes, the action space is not a bounded 1-D Box, or ``compute_reward`` is
            missing or not vectorized.
    """
    name = _resolve_env_id(env_id)
    kwargs: dict[str, Any] = {} if render_mode is None else {"render_mode": render_mode}
    env = gym.make(name, **kwargs)
    try:
        spec_from_env(env, env_id)
        env = wrap_goal_env(env)
    except Exception:
        env.close()
        raise
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


@functools.cache
def goal_env_spec(env_id: str) -> GoalEnvSpec:
    """Build one env, read its [`GoalEnvSpec`][her_envs.make.GoalEnvSpec], close it. Cached per ``env_id``."""
    env = gym.make(_resolve_env_id(env_id))
    try:
        return spec_from_env(env, env_id)
    finally:
        env.close()

"""Tests for envs/: goal env construction, validation, determinism, rendering and vector autoreset."""

from __future__ import annotations

import ctypes.util
import functools
import importlib.metadata
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest

from her_envs import (
    FETCH_TASKS,
    EnvWorkerDied,
    GraspedStart,
    ThresholdReward,
    goal_env_spec,
    make_env,
    make_vector_env,
    set_vector_rng_states,
    split_autoreset,
    vector_rng_states,
)

# ---------------------------------------------------------------------------------------------------------
# Tiny custom goal envs (registered under test-only ids)
# ---------------------------------------------------------------------------------------------------------


class _PointGoalEnv(gym.Env):
    """A 2-D point that moves by its action; success within 0.1 of the goal. Vectorized reward."""

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        box = gym.spaces.Box(-10.0, 10.0, (2,), np.float64)
        self.observation_space = gym.spaces.Dict(
            {"observation": box, "achieved_goal": box, "desired_goal": box}
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros(2)
        self.goal = np.zeros(2)

    def _obs(self):
        return {
            "observation": self.pos.copy(),
            "achieved_goal": self.pos.copy(),
            "desired_goal": self.goal.copy(),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2)
        self.goal = self.np_random.uniform(-1, 1, 2)
        return self._obs(), {}

    def step(self, action):
        self.pos = self.pos + np.asarray(action, dtype=np.float64)
        obs = self._obs()
        info = {"is_success": float(self._is_success(obs["achieved_goal"], self.goal)), **self._extra_info()}
        return obs, float(self.compute_reward(obs["achieved_goal"], self.goal, info)), False, False, info

    def _extra_info(self):
        return {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -(np.linalg.norm(achieved_goal - desired_goal, axis=-1) > 0.1).astype(np.float64)

    def _is_success(self, achieved_goal, desired_goal):
        return np.linalg.norm(achieved_goal - desired_goal, axis=-1) < 0.1


class _ScalarRewardGoalEnv(_PointGoalEnv):
    """compute_reward only handles one goal: float() of a batch raises."""

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -float(np.sqrt(np.sum((achieved_goal - desired_goal) ** 2)) > 0.1)


class _FlattenedRewardGoalEnv(_PointGoalEnv):
    """compute_reward silently returns one scalar for a whole batch (norm over all axes)."""

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -np.float64(np.linalg.norm(achieved_goal - desired_goal) > 0.1)


for _name, _cls in [
    ("TestPointGoal-v0", _PointGoalEnv),
    ("TestScalarRewardGoal-v0", _ScalarRewardGoalEnv),
    ("TestFlattenedRewardGoal-v0", _FlattenedRewardGoalEnv),
]:
    if _name not in gym.registry:
        gym.register(id=_name, entry_point=_cls, max_episode_steps=5)


# ---------------------------------------------------------------------------------------------------------
# Case R5: vectorized reward and its set-up check
# ---------------------------------------------------------------------------------------------------------


def test_fetch_compute_reward_is_vectorized_float32():
    spec = goal_env_spec("FetchReach-v4")
    assert spec.info_keys == ()
    assert (spec.observation_dim, spec.goal_dim, spec.action_dim, spec.max_episode_steps) == (10, 3, 4, 50)
    rng = np.random.default_rng(0)
    ag = rng.normal(1.3, 0.05, (7, 3))
    dg = ag.copy()
    dg[:3] += 0.2  # far: -1
    dg[3:] += 0.01  # near: 0
    reward = spec.compute_reward(ag, dg, None)
    assert reward.shape == (7,) and reward.dtype == np.float32
    assert set(np.unique(reward)) <= {-1.0, 0.0}
    np.testing.assert_array_equal(reward, [-1, -1, -1, 0, 0, 0, 0])
    success = spec.compute_success(ag, dg)
    assert success.shape == (7,) and success.dtype == bool
    np.testing.assert_array_equal(success, reward == 0)


@pytest.mark.parametrize("env_id", ["FetchPush-v4", "FetchReachDense-v4"])
def test_fetch_reward_matches_env(env_id):
    env = make_env(env_id)
    spec = goal_env_spec(env_id)
    rng = np.random.default_rng(1)
    ag, dg = rng.normal(1.3, 0.05, (2, 64, 3))
    np.testing.assert_allclose(
        spec.compute_reward(ag, dg, None), env.unwrapped.compute_reward(ag, dg, None), 1e-6
    )
    np.testing.assert_array_equal(spec.compute_success(ag, dg), env.unwrapped._is_success(ag, dg) == 1.0)
    assert isinstance(spec.compute_reward, ThresholdReward)
    env.close()


def test_other_goal_env_spec():
    spec = goal_env_spec("TestPointGoal-v0")
    ag, dg = np.zeros((7, 2)), np.full((7, 2), 0.05)
    dg[0] = 1.0
    np.testing.assert_array_equal(spec.compute_reward(ag, dg, None), [-1, 0, 0, 0, 0, 0, 0])
    assert spec.compute_reward(ag, dg, None).dtype == np.float32
    np.testing.assert_array_equal(spec.compute_success(ag, dg), [False] + [True] * 6)


@pytest.mark.parametrize("env_id", ["TestScalarRewardGoal-v0", "TestFlattenedRewardGoal-v0"])
def test_non_vectorized_reward_is_refused(env_id):
    for build in (make_env, goal_env_spec, lambda e: make_vector_env(e, 2)):
        with pytest.raises(TypeError, match=r"compute_reward is not vectorized.*\(7, 2\)") as err:
            build(env_id)
        assert "(7,)" in str(err.value) or "[B, G]" in str(err.value)
    with pytest.raises(TypeError, match="returned a scalar"):
        make_env("TestFlattenedRewardGoal-v0")


# ---------------------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------------------


def test_unknown_env_id_lists_fetch_ids():
    with pytest.raises(ValueError, match="Unknown env id 'FetchRech-v4'") as err:
        make_env("FetchRech-v4")
    assert "Did you mean" in str(err.value) and "FetchReach-v4" in str(err.value)
    for task in FETCH_TASKS:
        assert task in str(err.value)
    with pytest.raises(ValueError, match="Unknown env id"):
        make_vector_env("NoSuchEnv-v0", 2)


def test_non_goal_env_is_refused():
    with pytest.raises(
        TypeError, match=r"CartPole-v1 is not a goal env: expected .*Dict.*desired_goal.*got Box"
    ):
        make_env("CartPole-v1")
    with pytest.raises(TypeError, match="is not a goal env"):
        goal_env_spec("CartPole-v1")


def test_bad_vector_arguments():
    with pytest.raises(ValueError, match=r"vectorization must be one of \['async', 'sync'\], got 'threads'"):
        make_vector_env("FetchReach-v4", 2, vectorization="threads")
    with pytest.raises(ValueError, match="n_envs must be >= 1, got 0"):
        make_vector_env("FetchReach-v4", 0)
    with pytest.raises(TypeError, match="n_envs must be an int"):
        make_vector_env("FetchReach-v4", 2.0)


# ---------------------------------------------------------------------------------------------------------
# Case E1: determinism under a seed
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", FETCH_TASKS)
def test_reset_seed_is_deterministic(env_id):
    env = make_env(env_id, seed=0)
    fixed = np.array([0.5, -0.3, 0.2, 0.1], dtype=np.float32)
    env.reset(seed=42)
    first, *_ = env.step(fixed)
    for _ in range(10):
        env.step(env.action_space.sample())
    env.reset(seed=42)
    again, *_ = env.step(fixed)
    for key in first:
        np.testing.assert_array_equal(first[key], again[key], err_msg=key)
    env.close()


# ---------------------------------------------------------------------------------------------------------
# Case E2: headless rendering (each GL backend in its own process: MuJoCo picks it at import)
# ---------------------------------------------------------------------------------------------------------

_RENDER_SCRIPT = textwrap.dedent(
    """
    import her_envs
    env = her_envs.make_env("FetchReach-v4", seed=0, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    print("FRAME", frame.shape, frame.dtype, int(frame.max()))
    env.close()
    """
)


@pytest.mark.parametrize("backend, library", [("egl", "EGL"), ("osmesa", "OSMesa")])
def test_headless_render(backend, library):
    if ctypes.util.find_library(library) is None:
        pytest.skip(
            f"MUJOCO_GL={backend} needs lib{library}, not found (apt-get install libegl-mesa0 libosmesa6)"
        )
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    proc = subprocess.run(
        [sys.executable, "-c", _RENDER_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FRAME (480, 480, 3) uint8" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) > 0  # not a black frame


# ---------------------------------------------------------------------------------------------------------
# Dependency pin
# ---------------------------------------------------------------------------------------------------------


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def test_mujoco_version_satisfies_pin():
    installed = importlib.metadata.version("mujoco")
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        assert (3, 3) <= _version_tuple(installed) < (3, 12), installed
    else:
        assert installed in SpecifierSet(">=3.3,<3.12"), f"mujoco {installed} is outside >=3.3,<3.12"
    assert (3, 3) <= _version_tuple(installed) < (3, 12), installed


# ---------------------------------------------------------------------------------------------------------
# Vector envs: SAME_STEP autoreset
# ---------------------------------------------------------------------------------------------------------


def test_sync_vector_autoreset_final_obs():
    venv = make_vector_env("FetchReach-v4", 2, vectorization="sync", seed=3)
    obs, _ = venv.reset(seed=3)
    ends = 0
    for t in range(1, 56):
        prev = obs
        next_obs, _, terminated, truncated, infos = venv.step(venv.action_space.sample())
        step = split_autoreset(next_obs, terminated, truncated, infos)
        np.testing.assert_array_equal(step.done, terminated | truncated)
        assert step.is_success.shape == (2,) and step.is_success.dtype == bool
        # The desired goal stays fixed within an episode: real next obs always shares prev's goal.
        np.testing.assert_array_equal(step.real_next_obs["desired_goal"], prev["desired_goal"])
        if t == 50:
            assert truncated.all() and not terminated.any()
            assert infos["_final_obs"].tolist() == [True, True]
            for i in range(2):
                for key in next_obs:
                    np.testing.assert_array_equal(step.real_next_obs[key][i], infos["final_obs"][i][key])
                assert not np.array_equal(step.real_next_obs["desired_goal"][i], next_obs["desired_goal"][i])
                assert not np.array_equal(step.real_next_obs["observation"][i], next_obs["observation"][i])
            # success of the ended step comes from final_info (the top-level info is the reset info)
            expected = infos["final_info"]["is_success"].astype(bool)
            np.testing.assert_array_equal(step.is_success, expected)
            ends += 1
        else:
            assert not step.done.any() and "final_obs" not in infos
            for key in next_obs:
                np.testing.assert_array_equal(step.real_next_obs[key], next_obs[key])
        obs = next_obs
    assert ends == 1
    venv.close()


def test_async_vector_env_steps():
    venv = make_vector_env("FetchReach-v4", 2, vectorization="async", seed=0)
    assert isinstance(venv, gym.vector.AsyncVectorEnv)
    obs, _ = venv.reset(seed=0)
    assert obs["observation"].shape == (2, 10)
    next_obs, reward, terminated, truncated, infos = venv.step(venv.action_space.sample())
    step = split_autoreset(next_obs, terminated, truncated, infos)
    assert step.real_next_obs["achieved_goal"].shape == (2, 3) and reward.shape == (2,)
    venv.close()


def test_split_autoreset_uneven_endings():
    """Envs ending at different steps: only the ended env takes final_obs; success from final_info."""
    fns = [functools.partial(gym.make, "TestPointGoal-v0", max_episode_steps=n) for n in (2, 3)]
    venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, _ = venv.reset(seed=0)
    toward = (obs["desired_goal"] - obs["achieved_goal"]).astype(np.float32)  # reach the goal in 1 step
    venv.step(toward)
    next_obs, _, terminated, truncated, infos = venv.step(np.zeros((2, 2), np.float32))
    assert truncated.tolist() == [True, False]
    assert infos["final_obs"][1] is None and infos["_final_obs"].tolist() == [True, False]
    assert infos["_is_success"].tolist() == [False, True]  # env 0's top-level info is its reset info
    step = split_autoreset(next_obs, terminated, truncated, infos)
    np.testing.assert_allclose(step.real_next_obs["achieved_goal"][0], obs["desired_goal"][0], atol=1e-6)
    np.testing.assert_array_equal(step.real_next_obs["achieved_goal"][1], next_obs["achieved_goal"][1])
    np.testing.assert_array_equal(next_obs["achieved_goal"][0], [0, 0])  # reset obs
    assert step.is_success.tolist() == [True, True]
    venv.close()


def test_split_autoreset_needs_same_step_mode():
    venv = gym.vector.SyncVectorEnv(
        [lambda: gym.make("TestPointGoal-v0", max_episode_steps=1)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    venv.reset(seed=0)
    next_obs, _, terminated, truncated, infos = venv.step(np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="SAME_STEP"):
        split_autoreset(next_obs, terminated, truncated, infos)
    venv.close()


class _InfoRewardGoalEnv(_PointGoalEnv):
    """A vectorized reward that reads info["scale"] (a dict of [B] arrays in batches)."""

    def _extra_info(self):
        return {"scale": 2.0}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -info["scale"] * np.linalg.norm(achieved_goal - desired_goal, axis=-1)


def test_reward_reading_info_lists_its_keys():
    if "TestInfoRewardGoal-v0" not in gym.registry:
        gym.register(id="TestInfoRewardGoal-v0", entry_point=_InfoRewardGoalEnv, max_episode_steps=5)
    spec = goal_env_spec("TestInfoRewardGoal-v0")
    assert spec.info_keys == ("scale",)
    reward = spec.compute_reward(np.zeros((3, 2)), np.ones((3, 2)), {"scale": np.full(3, 0.5)})
    np.testing.assert_allclose(reward, -0.5 * np.sqrt(2), rtol=1e-6)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_restored_episode_start_rngs_redo_the_resets_of_the_current_episodes(vectorization):
    """A checkpoint between episodes: after SAME_STEP autoreset the sub-envs already drew their next goals; set
    back to the RNG states their current episodes began from, a fresh vector env's ``reset()`` gives the same
    observations and leaves the RNGs where the original's are, and the eval-style current states restore too."""
    venv = make_vector_env("TestPointGoal-v0", 2, vectorization, seed=3)
    venv.reset(seed=3)
    for _ in range(5):  # one 5-step episode per env: the last step autoresets both
        obs = venv.step(np.zeros((2, 2), np.float32))[0]
    start, now = vector_rng_states(venv, episode_start=True), vector_rng_states(venv)
    assert start != now
    fresh = make_vector_env("TestPointGoal-v0", 2, vectorization, seed=99)
    set_vector_rng_states(fresh, start)
    again, _ = fresh.reset()
    for k in obs:
        np.testing.assert_array_equal(again[k], obs[k])
    assert vector_rng_states(fresh) == now
    other = make_vector_env("TestPointGoal-v0", 2, vectorization, seed=7)
    set_vector_rng_states(other, now)
    expected, got = venv.reset()[0], other.reset()[0]
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])
    with pytest.raises(ValueError, match="1 saved env RNG states for 2 envs"):
        set_vector_rng_states(other, now[:1])
    for e in (venv, fresh, other):
        e.close()


def test_async_workers_know_envs_registered_here_whatever_the_global_start_method():
    """Importing torchrl sets the global start method to "spawn"; a spawned worker would not know an env
    registered at run time (here, by this test module). make_vector_env forks its workers regardless."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        venv = make_vector_env("TestPointGoal-v0", 2, "async", seed=0)
        obs = venv.step(np.zeros((2, 2), np.float32))[0]
        assert obs["observation"].shape[0] == 2
        venv.close()
    finally:
        multiprocessing.set_start_method(before, force=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (dead, not reaped) counts as dead
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_async_worker_is_named_and_closing_ends_the_others_within_seconds():
    """SIGKILL of one worker (the OOM killer): the next step raises EnvWorkerDied naming it, and close() kills
    the other at once (it was a bare EOFError, and a close that waited forever on the survivor)."""
    venv = make_vector_env("TestPointGoal-v0", 3, "async", seed=0)
    pids = [p.pid for p in venv.processes]
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(EnvWorkerDied, match=rf"^env worker 1 \(pid {pids[1]}\) was killed by SIGKILL \(the "
                       r"out-of-memory killer sends it: see `dmesg`\)$") as died:
        for _ in range(3):
            venv.step(np.zeros((3, 2), np.float32))
    assert (died.value.index, died.value.pid, died.value.exitcode) == (1, pids[1], -signal.SIGKILL)
    start = time.monotonic()
    venv.close()
    assert time.monotonic() - start < 5
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_async_workers_leave_stop_signals_to_the_trainer(sig, tmp_path):
    """Workers are forked from a trainer whose handlers stop it gracefully; a worker must not run them (it would
    swallow SIGTERM, so close() waited forever), nor die of a terminal's or a scheduler's signal to the whole
    process group before the trainer has checkpointed (it reads the workers' RNG states): they ignore SIGINT,
    SIGTERM and SIGHUP, the trainer closes them, and a worker that does not answer is killed."""
    ran = tmp_path / "handler-ran"

    def graceful_stop(signum, frame):  # the trainer's handler; a file shows whichever process ran it
        with open(ran, "a") as f:
            f.write(f"{os.getpid()}\n")

    old = signal.signal(sig, graceful_stop)
    try:
        venv = make_vector_env("TestPointGoal-v0", 2, "async", seed=0)
        os.kill(venv.processes[0].pid, sig)
        time.sleep(0.3)
        obs = venv.step(np.zeros((2, 2), np.float32))[0]  # the worker is alive and answers
        assert obs["observation"].shape == (2, 2)
        assert not ran.exists(), f"the trainer's handler ran in worker pid {ran.read_text()}"
        pids = [p.pid for p in venv.processes]
        venv.close()
        assert not any(_alive(pid) for pid in pids)
    finally:
        signal.signal(sig, old)


def test_async_workers_end_when_the_trainer_is_killed(tmp_path):
    """SIGKILL of the process that owns the vector env (no close() runs): its workers end within seconds
    instead of living on (and printing EOFError tracebacks)."""
    script = textwrap.dedent("""
        import sys, time
        from her_envs import make_vector_env
        venv = make_vector_env("FetchReach-v4", 2, "async", seed=0)
        print(*[p.pid for p in venv.processes], flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids)
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


# ---------------------------------------------------------------------------------------------------------
# Grasped start (HER paper, Sec. 4.1, pick-and-place)
# ---------------------------------------------------------------------------------------------------------


def test_grasped_start_holds_the_box_and_keeps_every_step():
    env = GraspedStart(make_env("FetchPickAndPlace-v4"), probability=1.0)
    obs, _ = env.reset(seed=3)
    grip, box, fingers = obs["observation"][:3], obs["achieved_goal"], obs["observation"][9:11]
    assert np.linalg.norm(box - grip) < 0.02, (box, grip)
    assert box[2] > env.unwrapped.height_offset + 0.05  # in the air, held
    assert np.all(fingers < 0.03) and np.all(fingers > 0.02)  # closed on the 5 cm box, not shut
    heights, steps, truncated = [], 0, False
    while not truncated:
        obs, _, _, truncated, _ = env.step(np.array([0.0, 0.0, 1.0, -1.0], np.float32))  # up, fingers closed
        heights.append(obs["achieved_goal"][2])
        steps += 1
    assert steps == env.spec.max_episode_steps  # the closing frames were not env steps
    assert heights[4] > box[2] + 0.03  # the box goes up with the gripper
    env.close()


def test_grasped_start_probability_zero_is_the_plain_env_and_one_half_repeats_with_the_seed():
    plain, never = make_env("FetchPickAndPlace-v4"), GraspedStart(make_env("FetchPickAndPlace-v4"), 0.0)
    for first in (True, False, False):  # later resets too: a probability of 0 draws nothing from the env's RNG
        kwargs = {"seed": 5} if first else {}
        for a, b in zip(plain.reset(**kwargs)[0].values(), never.reset(**kwargs)[0].values(), strict=True):
            np.testing.assert_array_equal(a, b)

    def held(env, seed):
        obs = env.reset(seed=seed)[0]
        out = [np.linalg.norm(obs["achieved_goal"] - obs["observation"][:3]) < 0.02]
        out += [np.linalg.norm((o := env.reset()[0])["achieved_goal"] - o["observation"][:3]) < 0.02
                for _ in range(19)]
        return out

    half = [GraspedStart(make_env("FetchPickAndPlace-v4"), 0.5) for _ in range(2)]
    first = held(half[0], 7)
    assert first == held(half[1], 7)
    assert 0 < sum(first) < len(first)
    for env in (plain, never, *half):
        env.close()


@pytest.mark.parametrize("env_id", ["FetchPush-v4", "FetchReach-v4"])
def test_grasped_start_is_refused_without_an_object_to_hold(env_id):
    with pytest.raises(ValueError, match=f"a grasped start needs a MuJoCo Fetch env with an object and an "
                                         f"unlocked gripper \\(FetchPickAndPlace\\), got {env_id}"):
        make_vector_env(env_id, 1, grasped_start=0.5)


def test_vector_env_with_grasped_start_starts_some_episodes_held():
    venv = make_vector_env("FetchPickAndPlace-v4", 2, seed=0, grasped_start=1.0)
    obs, _ = venv.reset(seed=0)
    assert np.all(np.linalg.norm(obs["achieved_goal"] - obs["observation"][:, :3], axis=1) < 0.02)
    venv.close()


def test_modules_by_concern_and_the_old_goal_env_path(monkeypatch):
    """envs/ is split by concern (spec, make, wrappers, vector); her_envs.goal_env re-exports the same objects, so
    old imports and objects pickled under that path keep working."""
    import importlib
    import pickle

    import her_envs
    from her_envs import goal_env

    for name in ("spec", "make", "wrappers", "vector", "goal_env"):
        module = importlib.import_module(f"her_envs.{name}")
        assert module.__doc__ and hasattr(module, "__all__"), name
        assert all(hasattr(module, n) for n in module.__all__), name
    assert set(her_envs.__all__) <= set(goal_env.__all__)
    assert all(getattr(goal_env, n) is getattr(her_envs, n) for n in her_envs.__all__)
    assert her_envs.goal_env is goal_env

    monkeypatch.setattr(ThresholdReward, "__module__", "her_envs.goal_env")  # as pickled before the split
    old = pickle.dumps(ThresholdReward(0.05, sparse=False))
    monkeypatch.undo()
    assert b"her_envs.goal_env" in old
    assert pickle.loads(old) == ThresholdReward(0.05, sparse=False)

"""Stable-Baselines3 adapter: ``her``'s episode storage and HER sampler as an SB3 replay buffer.

The replay underneath (storage, sampling, relabeling, returns) follows ``docs/semantics.md``; this docstring
adds what is particular to SB3.

Optional: this module imports ``stable_baselines3`` (and so torch and gymnasium); ``import her`` does not import
it. Use it with SB3's off-policy algorithms (SAC, TD3, DDPG; DQN with a Discrete action space) on goal envs
with Dict observations ``{"observation", "achieved_goal", "desired_goal"}``::

    from stable_baselines3 import SAC
    from her.sb3 import HerSB3ReplayBuffer

    model = SAC("MultiInputPolicy", env, learning_starts=1000,
                replay_buffer_class=HerSB3ReplayBuffer,
                replay_buffer_kwargs=dict(strategy="future", n_sampled_goal=4, n_step=1, prioritized=False))

Like SB3's own ``HerReplayBuffer``, the algorithm passes the (vector) env to the buffer, and the buffer takes
the env's vectorized ``compute_reward(achieved_goal, desired_goal, info)`` from it (``envs[0].unwrapped`` of a
``DummyVecEnv``, through ``env_method`` otherwise); ``compute_reward=`` overrides it.

Semantics of ``add(obs, next_obs, action, reward, done, infos)`` (SB3's call):

- ``done[i]`` ends env ``i``'s episode; it is a time-limit end (bootstrapping continues) when
  ``infos[i]["TimeLimit.truncated"]`` is true, a true termination otherwise (with
  ``handle_timeout_termination=False`` every end is a termination, as in SB3).
- SB3's VecEnvs reset automatically: for a done env ``next_obs[i]`` is already the *reset* observation and the
  real last state is ``infos[i]["terminal_observation"]``. The buffer stores the latter (SB3's
  ``_store_transition`` already substitutes it; the buffer does it too, so raw VecEnv output is fine). Under
  ``VecNormalize`` that terminal observation is normalized: the buffer un-normalizes it, as SB3's own buffers
  do, so everything stored is raw and normalized at sample time.
- Steps are staged per env and stored when their episode ends: only complete episodes are sampled, so
  ``learning_starts`` must cover at least one whole episode. If an env is reset outside an episode end (a new
  ``learn()`` call), the unfinished episode is dropped instead of being glued to the next one.

What ``sample`` returns (``DictReplayBufferSamples``):

- ``observations`` / ``next_observations``: dicts with ``observation``, ``achieved_goal`` (of ``s_t`` and of the
  bootstrap state ``s_{t+m}``) and ``desired_goal`` (the goal the transition is trained with, relabeled or not;
  the same in both dicts); ``observations`` are normalized by a ``VecNormalize`` env when SB3 passes one.
- ``rewards`` [B, 1]: recomputed with ``compute_reward`` for that goal; with ``n_step > 1`` the n-step return
  ``sum_{j<m} gamma^j r_{t+j}`` (``m = min(n, steps to the episode end)``).
- ``dones`` [B, 1]: 1.0 only where ``s_{t+m}`` is a true terminal state (never for a time-limit end), so SB3's
  ``r + (1 - dones) * gamma * Q'`` is right; with ``compute_terminated=`` it is recomputed for the sampled goal.
- ``discounts``: SB3's algorithms multiply the bootstrap value by ``gamma`` themselves, which is only right for
  one-step returns. With ``n_step == 1`` the field is left ``None`` (SB3 uses its own ``gamma``). With
  ``n_step > 1`` it is ``gamma ** m`` [B, 1], which SAC/TD3/DDPG/DQN use instead of ``gamma`` in SB3 versions
  whose ``ReplayBufferSamples`` have a ``discounts`` field (2.9.2 tested). Older SB3 versions have no such
  field, and the buffer refuses ``n_step > 1`` there. ``gamma`` must then be passed and equal the algorithm's
  ``gamma`` (the buffer cannot read it).

Supported envs and wrappers:

- observations: ``observation``, ``achieved_goal`` and ``desired_goal`` Boxes of any shape (images too, e.g.
  ``BitFlippingEnv(image_obs_space=True)``); they are stored as float32, so an image policy's ``/ 255``
  preprocessing sees the same values as with uint8 storage.
- VecEnvs: ``DummyVecEnv`` (``compute_reward`` called in-process) and ``SubprocVecEnv`` (called on env 0
  through ``env_method``: each batch's goals and info travel to the worker process).
- VecEnv wrappers: ``VecNormalize`` (raw storage, normalization at sample time, see above), ``VecMonitor``,
  ``VecCheckNan``, ``VecVideoRecorder`` and others that leave the goal entries as the env made them. Not
  supported: wrappers that change the goal entries, such as ``VecFrameStack`` (stacked goals) or
  ``VecTransposeImage`` on multi-channel image goals (transposed goals): ``compute_reward`` would receive goals
  in a layout the env does not know.
- gymnasium wrappers inside the envs (``TimeLimit``, ``Monitor``, ...): any; ``compute_reward`` is taken from
  ``unwrapped``.

``compute_reward`` is checked at set-up to be vectorized (``her.check_compute_reward``) where it can be called:
an env whose ``compute_reward`` needs a first ``reset`` (``BitFlippingEnv(image_obs_space=True)``), and any env
behind ``SubprocVecEnv`` (a call that raises would end its worker), are checked at the first real sample instead,
where every batch's reward shape is checked.

Prioritized replay (``prioritized=True``): SB3's stock ``train()`` neither weights its loss with importance
sampling weights nor returns TD errors to the buffer, so prioritized sampling with it would be a biased, never
updated prioritization. The buffer therefore requires a train step that, after each ``sample``, reads
``replay_buffer.last_weights`` (torch [B, 1], to weight the critic loss) and calls
``replay_buffer.update_priorities(td_error)`` (the TD errors of that batch); sampling again before that raises
``RuntimeError`` instead of silently degrading. Subclass the algorithm and override ``train()`` to do so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

try:
    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.buffers import BaseBuffer
    from stable_baselines3.common.preprocessing import get_action_dim
    from stable_baselines3.common.type_aliases import DictReplayBufferSamples
    from stable_baselines3.common.vec_env import unwrap_vec_normalize
    from stable_baselines3.her.her_replay_buffer import HerReplayBuffer as _SB3HerReplayBuffer
except ImportError as exc:  # pragma: no cover - exercised only without SB3
    raise ImportError(
        "her.sb3 needs stable-baselines3 (>= 2.0) and its dependencies: pip install 'stable-baselines3>=2.0'. "
        "The rest of `her` (EpisodeStorage, HerReplayBuffer, samplers) works without it."
    ) from exc

from .buffer import HerReplayBuffer
from .samplers import PrioritizedSampler, UniformSampler
from .storage import EpisodeStorage

__all__ = ["SB3_HAS_DISCOUNTS", "HerSB3ReplayBuffer"]

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
SB3_HAS_DISCOUNTS = "discounts" in DictReplayBufferSamples._fields
"""Whether this SB3 version's samples carry a per-sample bootstrap discount (needed for ``n_step > 1``)."""


def _unwrap_vec_env(env: Any) -> Any:
    while hasattr(env, "venv"):  # VecEnvWrapper (VecNormalize, VecMonitor, ...)
        env = env.venv
    return env


def compute_reward_from_env(env: Any) -> Any:
    """The vectorized ``compute_reward`` of an SB3 VecEnv's first env (direct when in-process)."""
    base = _unwrap_vec_env(env)
    envs = getattr(base, "envs", None)
    if envs:  # DummyVecEnv: call the env directly
        return envs[0].unwrapped.compute_reward

    def compute_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        return env.env_method("compute_reward", achieved_goal, desired_goal, info, indices=[0])[0]

    return compute_reward


def _not_callable_yet(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
    """Stands for a ``compute_reward`` that must not be probed at set-up (see the module docstring)."""
    raise RuntimeError("compute_reward is checked at the first real sample")


def _max_episode_steps(env: Any) -> int | None:
    try:
        spec = _unwrap_vec_env(env).get_attr("spec", indices=[0])[0]
        return int(spec.max_episode_steps) if spec is not None and spec.max_episode_steps else None
    except Exception:
        return None


class HerSB3ReplayBuffer(_SB3HerReplayBuffer):
    """An SB3 replay buffer backed by ``her.EpisodeStorage`` + ``her.HerReplayBuffer``.

    It subclasses SB3's ``HerReplayBuffer`` only so that SB3's algorithms pass it the env (and call
    ``set_env`` / ``truncate_last_trajectory`` after ``load_replay_buffer``); none of SB3's HER storage is
    allocated or used.

    Args (SB3 passes the first six; the rest go in ``replay_buffer_kwargs``):
        buffer_size: transitions kept (whole oldest episodes are dropped), over all envs.
        observation_space: a Dict space with ``observation``, ``achieved_goal``, ``desired_goal``.
        action_space: Box (continuous) or Discrete.
        env: the training VecEnv (SB3 passes it); gives ``compute_reward`` and ``max_episode_steps``.
        device: torch device of the sampled tensors.
        n_envs: parallel envs.
        optimize_memory_usage: must be False (states are stored once anyway).
        handle_timeout_termination: True: ``TimeLimit.truncated`` ends are not terminal (SB3's default).
        strategy: "future", "final" or "episode" (``goal_selection_strategy`` is accepted as an alias).
        n_sampled_goal: k; relabel probability k / (k + 1); 0 disables HER.
        n_step: n-step returns; > 1 needs an SB3 with ``discounts`` (2.9.2 tested) and ``gamma``.
        gamma: discount of the n-step return; must equal the algorithm's ``gamma`` (required when n_step > 1).
        prioritized: proportional prioritized replay; needs a custom train step (see the module docstring).
        alpha, beta0, beta_annealing_steps, eps, td_error_clip: ``her.PrioritizedSampler`` settings.
        compute_reward: vectorized ``compute_reward(achieved_goal, desired_goal, info)``; default: the env's.
        compute_terminated: optional vectorized ``compute_terminated(achieved_goal, desired_goal, info)`` of an
            env that ends episodes on success: ``dones`` are then recomputed for the sampled goal (see
            ``her.HerReplayBuffer``); default None: the stored ends.
        max_episode_steps: usual episode length; default: the env's spec, else 50 (longer episodes still fit).
        info_keys: ``{key: shape}`` of ``infos[i][key]`` to store and pass to ``compute_reward`` as
            ``info={key: [N, *shape]}`` (default none: ``info=None``; Fetch envs ignore it).
        copy_info_dict: accepted for compatibility with SB3's ``HerReplayBuffer``; info reaches
            ``compute_reward`` through ``info_keys`` (the named entries, batched), not as copies of whole dicts.
        seed: seed of the sampler's numpy Generator; default: drawn from ``np.random`` (which SB3 seeds).

    Raises:
        ValueError: a non-goal observation space, unsupported settings, n_step > 1 without SB3 support or
            without ``gamma``, no ``compute_reward``.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Dict,
        action_space: spaces.Space,
        env: Any = None,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        strategy: str | None = None,
        goal_selection_strategy: Any = None,
        n_sampled_goal: int = 4,
        n_step: int = 1,
        gamma: float | None = None,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta0: float = 0.4,
        beta_annealing_steps: int = 0,
        eps: float = 1e-6,
        td_error_clip: float | None = None,
        compute_reward: Any = None,
        compute_terminated: Any = None,
        max_episode_steps: int | None = None,
        info_keys: Mapping[str, tuple[int, ...]] | None = None,
        copy_info_dict: bool = False,
        seed: int | None = None,
    ) -> None:
        # SB3's BaseBuffer only: none of DictReplayBuffer's / HerReplayBuffer's arrays are allocated.
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        if optimize_memory_usage:
            raise ValueError("HerSB3ReplayBuffer does not support optimize_memory_usage=True (states are stored once)")
        if not isinstance(observation_space, spaces.Dict) or not set(GOAL_KEYS) <= set(observation_space.spaces):
            raise ValueError(f"HerSB3ReplayBuffer needs a Dict observation space with keys {GOAL_KEYS}, "
                             f"got {observation_space}")
        if strategy is not None and goal_selection_strategy is not None:
            raise ValueError("pass strategy or goal_selection_strategy, not both")
        if goal_selection_strategy is not None:
            strategy = getattr(goal_selection_strategy, "name", goal_selection_strategy)
        strategy = str(strategy or "future").lower()
        if int(n_step) > 1:
            if not SB3_HAS_DISCOUNTS:
                raise ValueError(
                    "n_step > 1 needs a stable-baselines3 whose replay samples carry `discounts` (2.9.2 has it): "
                    "SB3's algorithms otherwise bootstrap with gamma instead of gamma ** n. Upgrade SB3 or use n_step=1."
                )
            if gamma is None:
                raise ValueError("n_step > 1 needs gamma=<the algorithm's gamma> in replay_buffer_kwargs "
                                 "(the n-step return is discounted by the buffer)")
        self.env = env
        self.handle_timeout_termination = handle_timeout_termination
        self.optimize_memory_usage = False
        self.n_sampled_goal = int(n_sampled_goal)
        self.strategy = strategy
        self.n_step = int(n_step)
        self.prioritized = bool(prioritized)
        self.info_keys = {k: tuple(v) for k, v in (info_keys or {}).items()}
        self._user_compute_reward = compute_reward
        if max_episode_steps is None and env is not None:
            max_episode_steps = _max_episode_steps(env)
        self.action_dim = get_action_dim(action_space)
        self.storage = EpisodeStorage(
            buffer_size, observation_space["observation"].shape, (self.action_dim,),
            observation_space["achieved_goal"].shape, max_episode_steps=max_episode_steps or 50, n_envs=n_envs,
            info_shapes=self.info_keys,
        )
        sampler = (PrioritizedSampler(alpha=alpha, beta0=beta0, beta_annealing_steps=beta_annealing_steps, eps=eps,
                                      td_error_clip=td_error_clip)
                   if self.prioritized else UniformSampler())
        reward_fn = self._resolve_compute_reward()
        if seed is None:
            seed = int(np.random.randint(2**31 - 1))  # follows SB3's set_random_seed
        # A probe through SubprocVecEnv.env_method that raises (an env not yet reset) ends the worker: probe
        # in-process functions only; the others are checked by the first real sample.
        in_process = compute_reward is not None or bool(getattr(_unwrap_vec_env(env), "envs", None))
        self.her = HerReplayBuffer(self.storage, reward_fn if in_process else _not_callable_yet,
                                   strategy=strategy, n_sampled_goal=self.n_sampled_goal, n_step=self.n_step,
                                   gamma=0.99 if gamma is None else gamma, sampler=sampler, seed=seed,
                                   compute_terminated=compute_terminated)
        self.her.compute_reward = reward_fn
        self._last_next: dict[str, np.ndarray] | None = None  # per env: the last next state staged
        self._awaiting_priorities = False
        self.last_index: np.ndarray | None = None
        self.last_weights: th.Tensor | None = None

    # ------------------------------------------------------------------ env / persistence
    def _resolve_compute_reward(self) -> Any:
        if self._user_compute_reward is not None:
            return self._user_compute_reward
        if self.env is None:
            raise ValueError("HerSB3ReplayBuffer needs the env (SB3's algorithms pass it) or compute_reward=...")
        return compute_reward_from_env(self.env)

    def set_env(self, env: Any) -> None:
        """Attach the env after unpickling (SB3's ``load_replay_buffer`` calls it)."""
        self.env = env
        self.her.compute_reward = self._resolve_compute_reward()

    def __getstate__(self) -> dict[str, Any]:
        # The env and its bound compute_reward are not picklable in general: drop them, ``set_env`` restores.
        state = self.__dict__.copy()
        del state["env"]  # SB3's __setstate__ sets it to None
        her_buf = self.her
        state["her"] = object.__new__(type(her_buf))
        state["her"].__dict__.update(her_buf.__dict__)
        if self._user_compute_reward is None:
            state["her"].compute_reward = None
        return state

    def truncate_last_trajectory(self) -> None:
        """Drop the unfinished episodes (after a load the envs restart)."""
        self.her.discard_in_progress()
        self._last_next = None

    def reset(self) -> None:
        """Forget everything stored."""
        self.storage.load_state_dict(EpisodeStorage(
            self.storage.capacity, self.storage.observation_shape, self.storage.action_shape,
            self.storage.goal_shape, max_episode_steps=self.storage.max_episode_steps, n_envs=self.n_envs,
            info_shapes=self.info_keys).state_dict())
        self._last_next = None

    def size(self) -> int:
        """Sampleable transitions (complete episodes only)."""
        return len(self.storage)

    # ------------------------------------------------------------------ adding
    def add(  # type: ignore[override]
        self,
        obs: dict[str, np.ndarray],
        next_obs: dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        n = self.n_envs
        obs = {k: np.asarray(obs[k], np.float32).reshape(n, *self.storage_shape(k)) for k in GOAL_KEYS}
        nxt = {k: np.array(next_obs[k], np.float32).reshape(n, *self.storage_shape(k)) for k in GOAL_KEYS}
        done = np.asarray(done, bool).reshape(n)
        vec_normalize = unwrap_vec_normalize(self.env) if self.env is not None and done.any() else None
        for i in np.flatnonzero(done):  # VecEnv autoreset: the real last state
            term_obs = infos[i].get("terminal_observation")
            if term_obs is not None:
                if vec_normalize is not None:  # VecNormalize normalized it in place: store it raw, as SB3 does
                    term_obs = vec_normalize.unnormalize_obs(term_obs)
                for k in GOAL_KEYS:
                    nxt[k][i] = np.asarray(term_obs[k], np.float32).reshape(self.storage_shape(k))
        if self.handle_timeout_termination:
            timeout = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        else:
            timeout = np.zeros(n, bool)
        terminated, truncated = done & ~timeout, done & timeout
        # An env restarted without an episode end (e.g. a new learn() call resets the envs): drop its partial
        # episode rather than glue it onto the new one.
        if self._last_next is not None:
            staged = np.asarray(self.her.in_progress_lengths()) > 0
            for i in np.flatnonzero(staged):
                if not all(np.array_equal(obs[k][i], self._last_next[k][i]) for k in GOAL_KEYS):
                    self.her.discard_in_progress(int(i))
        info = {k: np.stack([np.asarray(inf[k], np.float32).reshape(s) for inf in infos])
                for k, s in self.info_keys.items()} or None
        action = np.asarray(action, np.float32).reshape(n, self.action_dim)
        reward = np.asarray(reward, np.float32).reshape(n)
        self.her.add(obs, action, reward, nxt, terminated, truncated, info)
        self._last_next = nxt
        self.pos = len(self.storage) % self.buffer_size  # SB3 bookkeeping only: sampling never uses it
        self.full = self.storage.n_episodes_added > self.storage.n_episodes  # old episodes were dropped

    def storage_shape(self, key: str) -> tuple[int, ...]:
        return self.storage.observation_shape if key == "observation" else self.storage.goal_shape

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, env: Any = None) -> DictReplayBufferSamples:  # type: ignore[override]
        """Draw a HER batch as SB3's ``DictReplayBufferSamples`` (see the module docstring).

        ``env``: SB3's ``VecNormalize`` (or None): observations and rewards are normalized with it.

        Raises:
            ValueError: no complete episode stored yet (raise ``learning_starts`` above the episode length).
            RuntimeError: prioritized and the previous batch's priorities were never updated.
        """
        if self._awaiting_priorities:
            raise RuntimeError(
                "HerSB3ReplayBuffer(prioritized=True): sample() called again without update_priorities() for the "
                "previous batch. SB3's stock train() neither weights the loss by importance-sampling weights nor "
                "returns TD errors; override the algorithm's train() to use `replay_buffer.last_weights` in the "
                "critic loss and call `replay_buffer.update_priorities(td_error)` after each batch, or use "
                "prioritized=False."
            )
        if len(self.storage) == 0:
            raise ValueError(
                "HerSB3ReplayBuffer: no complete episode stored yet (only whole episodes are sampled); set the "
                "algorithm's learning_starts above the episode length"
            )
        b = self.her.sample(int(batch_size))
        st = self.storage
        ag = st.achieved_goal[b.index]
        next_ag = st.achieved_goal[(b.index + b.n_steps) % st.n_slots]  # achieved goal of s_{t+m}
        obs = {"observation": b.observation, "achieved_goal": ag, "desired_goal": b.desired_goal}
        next_obs = {"observation": b.next_observation, "achieved_goal": next_ag, "desired_goal": b.desired_goal}
        obs = self._normalize_obs(obs, env)
        next_obs = self._normalize_obs(next_obs, env)
        rewards = self._normalize_reward(b.reward.reshape(-1, 1), env)
        kw = {}
        if self.n_step > 1:
            kw["discounts"] = self.to_torch(b.discount.reshape(-1, 1))
        if self.prioritized:
            self.last_index = b.index
            self.last_weights = self.to_torch(b.weight.reshape(-1, 1))
            self._awaiting_priorities = True
        return DictReplayBufferSamples(
            observations={k: self.to_torch(v) for k, v in obs.items()},
            actions=self.to_torch(b.action),
            next_observations={k: self.to_torch(v) for k, v in next_obs.items()},
            dones=self.to_torch(b.terminated.astype(np.float32).reshape(-1, 1)),
            rewards=self.to_torch(np.asarray(rewards, np.float32)),
            **kw,
        )

    def update_priorities(self, td_error: Any, index: np.ndarray | None = None) -> None:
        """Give the TD errors of the last sampled batch (or of ``index``) to the prioritized sampler.

        ``td_error``: [B] or [B, 1], numpy or torch (sign ignored; for twin critics pass e.g. the mean or max
        of their errors).

        Raises:
            ValueError: the buffer was built with ``prioritized=False`` (priorities would be ignored), no batch
                sampled yet, or bad TD errors.
        """
        if not self.prioritized:
            raise ValueError("update_priorities: this HerSB3ReplayBuffer samples uniformly, so priorities would be "
                             "ignored; pass prioritized=True in replay_buffer_kwargs for prioritized replay")
        if isinstance(td_error, th.Tensor):
            td_error = td_error.detach().cpu().numpy()
        idx = self.last_index if index is None else index
        if idx is None:
            raise ValueError("update_priorities: no batch sampled yet")
        self.her.update_priorities(idx, np.asarray(td_error).reshape(-1))
        self._awaiting_priorities = False

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> DictReplayBufferSamples:  # type: ignore[override]
        raise NotImplementedError("HerSB3ReplayBuffer samples through sample(batch_size)")

    def _compute_episode_length(self, env_idx: int) -> None:  # SB3 HER internals: unused here
        raise NotImplementedError

"""Acting: the policy's action for a batch of env steps, with the openai/baselines HER exploration (Gaussian noise
``noise_std`` clipped to ``[-1, 1]``, then per row with probability ``random_eps`` a uniform random action),
optionally colored noise (Eberhard et al. 2023), and the critic's value of the policy's action."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from .noise import ColoredNoise
from .numpy_actor import NumpyActor
from .normalizer import RunningNormalizer

__all__ = ["ActingMixin"]


class ActingMixin:
    """``act``, ``value``, ``explore`` and ``reset_noise`` of ``her_agents.algos.base.GoalConditionedAgentBase``
    (the attributes and methods annotated here are the base's and the algorithm's)."""

    config: Any
    device: torch.device
    obs_dim: int
    goal_dim: int
    action_dim: int
    actor: nn.Module
    rng: np.random.Generator
    obs_normalizer: RunningNormalizer
    goal_normalizer: RunningNormalizer

    #: the policy samples its own exploration (SAC, TQC): colored noise (``noise_beta``) drives that sample
    #: rather than the ``noise_std`` noise added in ``explore``
    stochastic_policy: bool = False

    def _policy(self, state: torch.Tensor, deterministic: bool, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The policy's action ``[N, action_dim]`` in ``[-1, 1]`` for preprocessed ``state`` (no grad); a stochastic
        policy (``stochastic_policy``) draws its standard normal sample from ``noise [N, action_dim]`` when
        given."""
        raise NotImplementedError

    def _actor_value(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The critic's value ``[B]`` that the actor's loss maximizes."""
        raise NotImplementedError

    if TYPE_CHECKING:  # the base's
        def preprocess(self, observation: torch.Tensor, desired_goal: torch.Tensor) -> torch.Tensor: ...
        def to_tensor(self, x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor: ...
        def set_training(self, training: bool) -> None: ...
        def autocast(self) -> contextlib.AbstractContextManager: ...

    def act(self, observation: np.ndarray, desired_goal: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions ``[N, action_dim]`` float32 in ``[-1, 1]`` (a single unbatched row is also accepted).

        With ``deterministic=False``: Gaussian noise ``noise_std`` is added and clipped to ``[-1, 1]``, then
        each row is replaced by a uniform random action with probability ``random_eps``. With ``noise_beta > 0``
        the Gaussian draws are row ``i``'s next step of a colored sequence (``ColoredNoise``; for SAC/TQC,
        the policy's own sample), so row ``i`` must be the same env at every call.

        On the CPU the policy runs in numpy on views of the actor's parameters (``NumpyActor``: faster for
        the few rows of acting, same function); elsewhere in torch, with the networks in eval mode.
        """
        single = np.ndim(observation) == 1
        numpy_actor = self.numpy_actor()
        noise = None if deterministic or self.config.noise_beta == 0 else self._colored_noise(
            int(np.prod(np.shape(observation)[:-1])))
        policy_noise = noise if self.stochastic_policy else None
        if numpy_actor is not None:
            observation, desired_goal = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x
                                         for x in (observation, desired_goal))
            action = numpy_actor(observation, desired_goal, deterministic, self.rng, policy_noise)
        else:
            obs_t = self.to_tensor(observation).reshape(-1, self.obs_dim)
            goal_t = self.to_tensor(desired_goal).reshape(-1, self.goal_dim)
            self.set_training(False)
            with torch.no_grad():
                action_t = self._policy(self.preprocess(obs_t, goal_t), deterministic,
                                        None if policy_noise is None else self.to_tensor(policy_noise))
            action = action_t.cpu().numpy()
        action = action.astype(np.float32, copy=False)
        if not deterministic:
            action = self.explore(action, None if self.stochastic_policy else noise)
        return action[0] if single else action

    #: act in numpy on a CPU (``NumpyActor``); False: always in torch
    numpy_acting: bool = True

    def numpy_actor(self) -> NumpyActor | None:
        """The ``NumpyActor`` of ``actor`` on the CPU (built once per actor); None on other devices, with
        ``numpy_acting`` off, or for an actor numpy cannot mirror: ``act()`` then runs torch."""
        if self.device.type != "cpu" or not self.numpy_acting:
            return None
        cached = self.__dict__.get("_numpy_actor")
        if cached is None or cached[0] is not self.actor:
            try:
                built: NumpyActor | None = NumpyActor(self.actor, self.obs_normalizer, self.goal_normalizer)
            except TypeError:
                built = None
            cached = self.__dict__["_numpy_actor"] = (self.actor, built)
        return cached[1]

    def value(self, observation: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        """``V(s, g) = Q(s, mu(s, g), g)`` float32 ``[N]`` for ``observation [N, obs_dim]`` and ``desired_goal
        [N, goal_dim]``: the value the actor maximizes (``_actor_value``) at the policy's deterministic action
        (SAC: the mean action), no grad. Used to judge which goals the agent can reach (``her.MinDensityGoals``)."""
        obs_t = self.to_tensor(observation).reshape(-1, self.obs_dim)
        goal_t = self.to_tensor(desired_goal).reshape(-1, self.goal_dim)
        self.set_training(False)
        with torch.no_grad():
            state = self.preprocess(obs_t, goal_t)
            with self.autocast():
                v = self._actor_value(state, self._policy(state, True))
        return v.float().cpu().numpy()

    def _colored_noise(self, n: int) -> np.ndarray:
        """The next colored noise ``[n, action_dim]`` (``ColoredNoise`` on ``rng``, ``noise_beta > 0``)."""
        source = self.__dict__.get("_noise_source")
        if source is None or source.rng is not self.rng:
            source = self.__dict__["_noise_source"] = ColoredNoise(
                self.config.noise_beta, self.action_dim, self.config.noise_horizon, self.rng)
        return source.sample(n)

    def reset_noise(self, done: np.ndarray) -> None:
        """Start a new colored noise sequence (``noise_beta > 0``) for the envs whose episode ended: ``done``, bool
        ``[n_envs]``, in the rows' order of ``act``. A no-op with white noise."""
        source = self.__dict__.get("_noise_source")
        if source is not None:
            source.reset(done)

    def explore(self, action: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """Gaussian noise ``noise_std * z`` (clipped to ``[-1, 1]``; ``z`` standard normal, ``noise`` where given)
        plus per-row uniform random actions with prob ``random_eps``."""
        cfg = self.config
        n = action.shape[0]
        if cfg.noise_std > 0:
            z = self.rng.standard_normal(action.shape, dtype=np.float32) if noise is None else noise
            action = action + cfg.noise_std * z
            np.maximum(action, -1.0, out=action)  # in place: np.clip allocates and is slower on one row
            np.minimum(action, 1.0, out=action)
        if cfg.random_eps > 0:
            rows = self.rng.random(n) < cfg.random_eps
            if rows.any():
                action = action.copy() if not action.flags.writeable else action
                action[rows] = self.rng.uniform(-1.0, 1.0, size=(int(rows.sum()), self.action_dim))
        return action.astype(np.float32, copy=False)

"""Acting on a CPU in numpy: the policy network's forward pass over views of its parameters, and the input
normalization, for the few rows of one env step, where a torch call's dispatch costs more than its arithmetic.

Measured with ``python tests/benchmarks/bench_act.py`` (``act()`` per env step with exploration, FetchPush sizes,
3x256 LayerNorm actor, one torch thread, ``OPENBLAS_NUM_THREADS=1``, on the 2-core shared "Intel(R) Xeon(R)
Processor" of the development machine with two training runs beside it, 2026-12-07): DDPG one row 0.43 ms in numpy
against 0.85 ms in torch, SAC 0.82 against 2.6 ms; a second reading on a busier machine DDPG 1.8 / 4.0 ms (one
row), 3.8 / 5.3 ms (16 rows), SAC 1.2 / 4.6 ms and 2.8 / 4.3 ms: numpy is 1.4-3.9x faster. Same function as the
torch policy (tests/test_agents.py compares the two).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import numpy as np
from torch import nn

from .networks import DeterministicActor, SquashedGaussianActor
from .normalizer import RunningNormalizer

__all__ = ["NumpyActor", "numpy_mlp"]

NumpyPolicy = Callable[[np.ndarray, bool, np.random.Generator, "np.ndarray | None"], np.ndarray]


def numpy_mlp(net: nn.Sequential) -> Callable[[np.ndarray], np.ndarray]:
    """``net``'s forward pass in numpy float32 over views of its CPU parameters (no copies: optimizer steps and
    ``load_state_dict``, which write the parameters in place, are seen at once). Supports the layers
    ``her_agents.algos.networks.mlp`` builds (``Linear``, ``LayerNorm``, ``ReLU``).

    Returns:
        ``f(x float32 [N, in]) -> float32 [N, out]``.
    Raises:
        TypeError: a layer of another type, or parameters not on the CPU.
    """
    steps: list[tuple[Any, ...]] = []
    for m in net:
        if any(p.device.type != "cpu" for p in m.parameters()):
            raise TypeError("numpy_mlp needs the network's parameters on the CPU")
        if isinstance(m, nn.Linear):
            steps.append(("linear", m.weight.detach().numpy().T, m.bias.detach().numpy()))
        elif isinstance(m, nn.LayerNorm):
            steps.append(("layer_norm", m.weight.detach().numpy(), m.bias.detach().numpy(), m.eps))
        elif isinstance(m, nn.ReLU):
            steps.append(("relu",))
        else:
            raise TypeError(f"numpy_mlp supports Linear, LayerNorm and ReLU layers, got {type(m).__name__}")

    def forward(x: np.ndarray) -> np.ndarray:
        for step in steps:
            if step[0] == "linear":
                x = x @ step[1]
                x += step[2]
            elif step[0] == "relu":
                np.maximum(x, 0.0, out=x)
            else:
                x = x - x.mean(-1, keepdims=True)
                x /= np.sqrt(np.square(x).mean(-1, keepdims=True) + step[3])
                x *= step[1]
                x += step[2]
        return x

    return forward


def numpy_policy(actor: nn.Module) -> NumpyPolicy:
    """``f(state float32 [N, S], deterministic, rng, noise=None) -> action float32 [N, A]``: the action of
    ``actor``'s forward pass in numpy. A ``SquashedGaussianActor`` samples with ``noise [N, A]`` where given,
    else draws it from the numpy Generator ``rng``; a ``DeterministicActor`` uses neither.

    Raises:
        TypeError: another actor type, or a layer ``numpy_mlp`` does not know.
    """
    net = numpy_mlp(typing.cast(nn.Sequential, actor.net))
    if isinstance(actor, DeterministicActor):
        def deterministic_policy(state: np.ndarray, deterministic: bool, rng: np.random.Generator,
                                 noise: np.ndarray | None = None) -> np.ndarray:
            return np.tanh(net(state))

        return deterministic_policy
    if not isinstance(actor, SquashedGaussianActor):
        raise TypeError(f"no numpy policy for {type(actor).__name__}")
    lo, hi, n_act = actor.log_std_min, actor.log_std_max, actor.action_dim

    def policy(state: np.ndarray, deterministic: bool, rng: np.random.Generator,
               noise: np.ndarray | None = None) -> np.ndarray:
        out = net(state)
        mu = out[:, :n_act]
        if deterministic:
            return np.tanh(mu)
        std = np.exp(np.clip(out[:, n_act:], lo, hi))
        if noise is None:
            noise = rng.standard_normal(mu.shape, dtype=np.float32)
        return np.tanh(mu + std * noise)

    return policy


class NumpyActor:
    """An agent's policy in numpy: ``concat(observation, goal)`` normalized in one pass, then the actor.

    Built once per actor (it holds views of the parameters); the normalization statistics are re-read whenever a
    normalizer publishes new ones (``RunningNormalizer.mean32`` / ``std32`` are new arrays at every change).

    Raises:
        TypeError: as ``numpy_policy`` (the agent then acts in torch).
    """

    def __init__(self, actor: nn.Module, obs_normalizer: RunningNormalizer, goal_normalizer: RunningNormalizer
                 ) -> None:
        self.actor, self.policy = actor, numpy_policy(actor)
        self.obs_normalizer, self.goal_normalizer = obs_normalizer, goal_normalizer
        self._stats: tuple[tuple[Any, ...], tuple[np.ndarray, ...]] | None = None

    def __call__(self, observation: np.ndarray, desired_goal: np.ndarray, deterministic: bool,
                 rng: np.random.Generator, noise: np.ndarray | None = None) -> np.ndarray:
        """``observation [N, obs_dim], desired_goal [N, goal_dim]`` (or one row each) -> actions float32
        ``[N, action_dim]``."""
        on, gn = self.obs_normalizer, self.goal_normalizer
        state = np.concatenate([np.reshape(observation, (-1, on.size)), np.reshape(desired_goal, (-1, gn.size))],
                               axis=1, dtype=np.float32)
        mean, std, obs_low, obs_high, low, high = self._state_stats()
        np.maximum(state, obs_low, out=state)
        np.minimum(state, obs_high, out=state)
        state -= mean
        state /= std
        np.maximum(state, low, out=state)
        np.minimum(state, high, out=state)
        return self.policy(state, deterministic, rng, noise)

    def _state_stats(self) -> tuple[np.ndarray, ...]:
        """Mean, std and clip bounds of observation and goal side by side, float32 ``[S]`` each."""
        on, gn = self.obs_normalizer, self.goal_normalizer
        key = (on.mean32, on.std32, gn.mean32, gn.std32, on.clip_obs, gn.clip_obs, on.clip_range, gn.clip_range)
        if (self._stats is not None and all(a is b for a, b in zip(self._stats[0][:4], key[:4]))
                and self._stats[0][4:] == key[4:]):
            return self._stats[1]

        def joined(obs_part: Any, goal_part: Any) -> np.ndarray:
            return np.concatenate([np.broadcast_to(obs_part, on.size),
                                   np.broadcast_to(goal_part, gn.size)]).astype(np.float32)

        clip_obs, clip_range = joined(on.clip_obs, gn.clip_obs), joined(on.clip_range, gn.clip_range)
        stats = (joined(on.mean32, gn.mean32), joined(on.std32, gn.std32), -clip_obs, clip_obs, -clip_range,
                 clip_range)
        self._stats = (key, stats)
        return stats

"""TD targets and their bounds: ``y = clip(r + discount * (1 - terminated) * next_q)`` and the clip an env's
reward range implies (openai/baselines HER clips Q to ``[-1/(1-gamma), 0]`` for -1/0 rewards)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["clip_q", "q_clip_for_env", "td_target", "td_target_bounds"]


def clip_q(y: torch.Tensor, q_clip: tuple[float, float] | None) -> torch.Tensor:
    """Clip a TD target to ``q_clip`` (no-op when None)."""
    if q_clip is None:
        return y
    return y.clamp(q_clip[0], q_clip[1])


def td_target_bounds(reward_range: tuple[float, float] | None, gamma: float) -> tuple[float, float] | None:
    """Bounds of every discounted return ``sum_{j<m} gamma^j r_j`` (``1 <= m <= inf``) for rewards in
    ``reward_range = (r_min, r_max)``, so of Q and of every TD target that bootstraps from a bounded Q.

    ``low = r_min / (1 - gamma)`` if ``r_min < 0`` else ``r_min``; ``high = r_max / (1 - gamma)`` if
    ``r_max > 0`` else ``r_max`` (an infinite side where gamma is 1 or the reward unbounded). -1/0 rewards give
    ``[-1/(1-gamma), 0]``, 0/1 rewards ``[0, 1/(1-gamma)]``. Returns None when ``reward_range`` is None or both
    sides are infinite; finite bounds are rounded to float32 (the TD targets' dtype).
    """
    if reward_range is None:
        return None
    r_min, r_max = (float(v) for v in reward_range)
    scale = np.inf if gamma >= 1.0 else 1.0 / (1.0 - float(gamma))

    def bound(r: float, outward: bool) -> float:
        b = r * scale if outward and r != 0 else r
        return float(np.float32(b)) if np.isfinite(b) else b

    low, high = bound(r_min, r_min < 0), bound(r_max, r_max > 0)
    if not (np.isfinite(low) or np.isfinite(high)):
        return None
    return low, high


_UNSET = object()


def q_clip_for_env(reward_range: tuple[float, float] | None, gamma: float, env_id: str,
                   configured: Any = _UNSET) -> tuple[float, float] | None:
    """The TD-target clip for an env: ``configured`` (``agent.q_clip``) when given, else
    ``td_target_bounds`` of the env's ``reward_range``.

    Args:
        reward_range: ``GoalEnvSpec.reward_range`` (``(low, high)``, a side may be infinite, or None).
        gamma: the discount.
        env_id: named in the error message.
        configured: ``[low, high]``, or None (no clip); omitted: derive from ``reward_range``.

    Raises:
        ValueError: ``configured`` excludes a reward the env can give (a finite side of ``reward_range``
            outside ``[low, high]``): such a clip would hold Q away from the values it must learn.
    """
    derived = td_target_bounds(reward_range, gamma)
    if configured is _UNSET:
        return derived
    if configured is None:
        return None
    low, high = (float(v) for v in configured)
    if reward_range is not None:
        r_min, r_max = (float(v) for v in reward_range)
        if (np.isfinite(r_min) and r_min < low) or (np.isfinite(r_max) and r_max > high):
            hint = f"[{derived[0]}, {derived[1]}]" if derived is not None else "null"
            raise ValueError(
                f"agent.q_clip must contain the rewards of {env_id} (reward range [{r_min}, {r_max}]), "
                f"got [{low}, {high}]; use {hint} (the bound for gamma {gamma}), or leave agent.q_clip unset to "
                "derive it from the env"
            )
    return low, high


def td_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    q_clip: tuple[float, float] | None,
) -> torch.Tensor:
    """``y = clip(r + discount * (1 - terminated) * next_q)``, every input and the output shaped ``[B]``."""
    assert reward.dim() == 1 and reward.shape == discount.shape == terminated.shape == next_q.shape, (
        f"TD target shapes must all be [B]: reward {tuple(reward.shape)}, discount {tuple(discount.shape)}, "
        f"terminated {tuple(terminated.shape)}, next_q {tuple(next_q.shape)}"
    )
    return clip_q(reward + discount * (1.0 - terminated) * next_q, q_clip)

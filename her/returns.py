"""Returns: which return each sampled transition is trained with, rewards recomputed for its (relabeled) goal.
Semantics: ``docs/semantics.md``.

- [`OneStepReturn`][her.returns.OneStepReturn]: ``r_t = compute_reward(ag_{t+1}, g', info_t)``, bootstrap from
  ``s_{t+1}`` with
  discount ``gamma``.
- [`NStepReturn`][her.returns.NStepReturn]: ``sum_{j<m} gamma^j r_{t+j}`` with ``g'`` fixed over the window,
  ``m = min(n, T - t, steps to the first termination)``, bootstrap from ``s_{t+m}`` with ``gamma^m`` (Peng &
  Williams 1996; Hessel et al. 2018, "Rainbow", Sec. 3); optionally the window ends where ``g'`` is first
  achieved (Yang et al. 2021, "Bias-reduced multi-step hindsight experience replay"). ``n = 1`` is exactly
  [`OneStepReturn`][her.returns.OneStepReturn].
- With ``compute_terminated`` (a goal env's own, see ``TerminatedFn``) every sampled transition's ``terminated``
  is recomputed for its goal too, ``d_t = compute_terminated(ag_{t+1}, g', info_t)``, and an n-step window ends
  at its first such step; without it the stored flags are used (the episode's real end).

Any object with the [`Returns`][her.returns.Returns] method plugs into ``HerReplayBuffer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ._util import filled
from .storage import EpisodeStorage

__all__ = ["NStepReturn", "OneStepReturn", "ReturnBatch", "Returns", "RewardFn", "SuccessFn", "TerminatedFn",
           "make_returns"]

RewardFn = Callable[[np.ndarray, np.ndarray, Any], np.ndarray]
"""``compute_reward(achieved_goal [N, *g], desired_goal [N, *g], info) -> reward [N]``, vectorized over N.
``achieved_goal`` is the achieved goal of the *next* state ``s_{t+1}``, ``desired_goal`` the (relabeled) goal
(both fresh float32 arrays of the batch, possibly strided views of its gathered records),
``info`` a dict ``{key: [N, ...]}`` of the stored per-step info arrays of transition ``t``, or None when the
storage keeps no info keys (gymnasium-robotics' Fetch envs ignore it)."""

SuccessFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``compute_success(achieved_goal [N, *g], desired_goal [N, *g]) -> bool [N]``."""

TerminatedFn = Callable[[np.ndarray, np.ndarray, Any], np.ndarray]
"""``compute_terminated(achieved_goal [N, *g], desired_goal [N, *g], info) -> bool [N]`` (or 0/1 numbers),
vectorized over N, called with the same arguments as ``compute_reward``: gymnasium-robotics' ``GoalEnv`` API
(``env.step``'s ``terminated`` is ``compute_terminated(ag, g, info)``). A termination that does not depend on
the goal (a crash) must be readable from the stored ``info`` keys, as that API asks."""


class ReturnBatch(NamedTuple):
    """What a [`Returns`][her.returns.Returns] builds for a batch of B transitions.

    Attributes:
        reward: float32 [B] the (n-step) return ``sum_{j<m} gamma^j r_{t+j}``.
        discount: float32 [B] ``gamma^m``, the discount of the bootstrap value.
        terminated: bool [B] the bootstrap state is a true terminal state.
        next_slots: int64 [B] slots of the bootstrap states ``s_{t+m}`` (before the ring's modulo).
        n_steps: int64 [B] the window length m.
    """

    reward: np.ndarray
    discount: np.ndarray
    terminated: np.ndarray
    next_slots: np.ndarray
    n_steps: np.ndarray


@runtime_checkable
class Returns(Protocol):
    """Which return each sampled transition gets."""

    gamma: float

    def build(self, storage: EpisodeStorage, slots: np.ndarray, records: np.ndarray, goals: np.ndarray | None,
              compute_reward: RewardFn | None) -> ReturnBatch:
        """Returns of the transitions in ``slots``.

        Args:
            storage: the storage.
            slots: int64 [B] transition slots.
            records: ``storage.gather(slots)``.
            goals: float32 [B, *g] the goals to train with (None for a goal-free storage: use stored rewards).
            compute_reward: vectorized ``compute_reward(achieved_goal [N, *g], desired_goal [N, *g], info)``.

        A class that also takes ``compute_terminated=None`` (a [`TerminatedFn`][her.returns.TerminatedFn]; the
        built-in ones do) can
        be used with ``HerReplayBuffer(..., compute_terminated=...)``, which passes it by keyword.
        """
        ...


def rewards(compute_reward: RewardFn, achieved_goal: np.ndarray, goals: np.ndarray, info: dict | None,
            n: int) -> np.ndarray:
    """``compute_reward(achieved_goal, goals, info)`` as float32 [n].

    Raises:
        ValueError: it returned another shape.
    """
    r = np.asarray(compute_reward(achieved_goal, goals, info or None), np.float32)
    if r.shape != (n,):
        raise ValueError(f"compute_reward returned shape {r.shape}, expected ({n},)")
    return r


def terminals(compute_terminated: TerminatedFn, achieved_goal: np.ndarray, goals: np.ndarray, info: dict | None,
              n: int) -> np.ndarray:
    """``compute_terminated(achieved_goal, goals, info)`` as bool [n].

    Raises:
        ValueError: it returned another shape (e.g. a scalar: not vectorized), or NaN.
    """
    d = np.asarray(compute_terminated(achieved_goal, goals, info or None))
    if d.shape != (n,):
        raise ValueError(f"compute_terminated returned shape {d.shape}, expected ({n},): it must be vectorized, "
                         "compute_terminated(achieved_goal [N, *g], desired_goal [N, *g], info) -> bool [N]")
    if d.dtype == np.bool_:
        return d
    if d.dtype.kind == "f" and np.isnan(d).any():  # bool(NaN) is True: a NaN would end windows silently
        raise ValueError(f"compute_terminated returned NaN for {int(np.isnan(d).sum())} of {n} goals (first at "
                         f"row {int(np.flatnonzero(np.isnan(d))[0])})")
    return d.astype(bool)


def _check_gamma(gamma: float) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.number)) or not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    return float(gamma)


class OneStepReturn:
    """``r_t`` recomputed for the goal, bootstrap from ``s_{t+1}`` with ``gamma`` unless terminated.

    Raises:
        ValueError: gamma not in (0, 1].
    """

    n_step = 1

    def __init__(self, gamma: float = 0.98) -> None:
        self.gamma = _check_gamma(gamma)

    def build(self, storage, slots, records, goals, compute_reward, compute_terminated=None):
        B = len(slots)
        terminated = records["terminated"]
        if goals is not None:  # each record keeps ag_{t+1}: no gather of the next state needed for the reward
            info = {k: records["info." + k] for k in storage.info_shapes} if storage.info_shapes else None
            r = rewards(compute_reward, records["next_achieved_goal"], goals, info, B)
            if compute_terminated is not None:
                terminated = terminals(compute_terminated, records["next_achieved_goal"], goals, info, B)
        else:
            r = records["reward"]
        return ReturnBatch(r, filled(B, self.gamma, "float32"), terminated, slots + 1, filled(B, 1, "int64"))

    def __repr__(self) -> str:
        return f"OneStepReturn(gamma={self.gamma})"


class NStepReturn:
    """n-step returns with the goal fixed over the window (see the module docstring).

    Args:
        n_step: n >= 1.
        gamma: discount factor in (0, 1].
        stop_at_success: end the window at the first step whose next state achieves the goal; needs
            ``compute_success``.
        compute_success: vectorized ``compute_success(achieved_goal [N, *g], desired_goal [N, *g]) -> bool [N]``.

    ``build(..., compute_terminated=fn)``: the window also ends at the first step ``j`` with
    ``fn(ag_{t+j+1}, g', info_{t+j})`` true (its reward counted, none after it), and ``terminated`` is whether
    the window's last step is such a step; otherwise the stored flags (the episode's real end) decide.

    Raises:
        ValueError: n not an integer >= 1, gamma not in (0, 1], stop_at_success without compute_success;
            ``build``: compute_reward / compute_terminated returning another shape than ``[B * n]``.
    """

    def __init__(self, n_step: int = 3, gamma: float = 0.98, stop_at_success: bool = False,
                 compute_success: SuccessFn | None = None) -> None:
        if isinstance(n_step, bool) or not isinstance(n_step, (int, np.integer)) or n_step < 1:
            raise ValueError(f"n_step must be an integer >= 1, got {n_step!r}")
        if stop_at_success and compute_success is None:
            raise ValueError("stop_at_success needs a goal storage and compute_success(achieved_goal, desired_goal)")
        self.n_step, self.gamma = int(n_step), _check_gamma(gamma)
        self.stop_at_success, self.compute_success = bool(stop_at_success), compute_success
        self._powers = (self.gamma ** np.arange(self.n_step + 1)).astype(np.float32)
        self._window = np.arange(self.n_step)

    def build(self, storage, slots, records, goals, compute_reward, compute_terminated=None):
        st, n, B, rec = storage, self.n_step, len(slots), records
        if goals is None and self.stop_at_success:
            raise ValueError("stop_at_success needs a goal storage and compute_success(achieved_goal, desired_goal)")
        left = rec["length"] - rec["step"]  # transitions from t to the episode's end, >= 1
        valid = self._window < left[:, None]  # [B, n] the window's steps inside the episode (a prefix)
        flat_next = (slots[:, None] + (self._window + 1)).reshape(-1)  # states s_{t+1..t+n}, modulo by take
        wrec = None
        if st.info_shapes or goals is None:  # per-step info (or stored rewards) of transitions t..t+n-1
            wrec = st.data.take(flat_next - 1, mode="wrap")
        if goals is not None:
            ag_next = st.achieved_goal.take(flat_next, axis=0, mode="wrap")
            g_rep = np.repeat(goals, n, axis=0)
            info = {k: wrec["info." + k] for k in st.info_shapes} if st.info_shapes else None
            r = rewards(compute_reward, ag_next, g_rep, info, B * n).reshape(B, n)
            if self.stop_at_success:
                hit = np.asarray(self.compute_success(ag_next, g_rep), bool).reshape(B, n) & valid
                first = np.where(hit.any(1), hit.argmax(1), n)
                valid &= self._window <= first[:, None]
            if compute_terminated is not None:  # the window ends at the first terminal step for the goal
                ends = terminals(compute_terminated, ag_next, g_rep, info, B * n).reshape(B, n) & valid
                first_end = np.where(ends.any(1), ends.argmax(1), n)
                valid &= self._window <= first_end[:, None]
        else:
            r = wrec["reward"].reshape(B, n)
        cut = self.stop_at_success or (compute_terminated is not None and goals is not None)
        m = valid.sum(1) if cut else np.minimum(left, n).astype(np.int64)
        ret = np.where(valid, r, np.float32(0.0)) @ self._powers[:n]
        if compute_terminated is not None and goals is not None:
            terminated = first_end == m - 1  # its last step is terminal for the goal (not cut earlier by success)
        else:  # the window ends in a true terminal state only at its episode's last transition
            terminated = rec["episode_terminated"] & (m == left)
        return ReturnBatch(ret, self._powers[m], terminated, slots + m, m)

    def __repr__(self) -> str:
        return f"NStepReturn(n_step={self.n_step}, gamma={self.gamma}, stop_at_success={self.stop_at_success})"


def make_returns(n_step: int = 1, gamma: float = 0.98, stop_at_success: bool = False,
                 compute_success: SuccessFn | None = None) -> OneStepReturn | NStepReturn:
    """[`OneStepReturn`][her.returns.OneStepReturn] for ``n_step = 1`` without stop-at-success, else
    [`NStepReturn`][her.returns.NStepReturn].

    Raises:
        ValueError: see the two classes.
    """
    if n_step == 1 and not stop_at_success and not isinstance(n_step, bool):
        return OneStepReturn(gamma)
    return NStepReturn(n_step, gamma, stop_at_success, compute_success)

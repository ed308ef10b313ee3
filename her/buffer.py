"""The replay buffer: storage -> transitions (uniform | prioritized) -> goals (HER) -> returns (1-step | n-step).

``HerReplayBuffer`` composes the four pieces and returns ``Batch`` objects of numpy arrays. Every combination
of sampler, relabel strategy and n works; goal-free storages skip the relabeling and use the stored rewards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._util import filled
from .relabel import GoalRelabeler
from .samplers import PrioritizedSampler, UniformSampler
from .storage import EpisodeStorage

__all__ = ["Batch", "HerReplayBuffer", "RewardFn", "SuccessFn", "check_compute_reward"]

RewardFn = Callable[[np.ndarray, np.ndarray, Any], np.ndarray]
"""``compute_reward(achieved_goal [N, *g], desired_goal [N, *g], info) -> reward [N]``, vectorized over N.
``achieved_goal`` is the achieved goal of the *next* state ``s_{t+1}``, ``desired_goal`` the (relabeled) goal
(both fresh float32 arrays of the batch, possibly strided views of its gathered records),
``info`` a dict ``{key: [N, ...]}`` of the stored per-step info arrays of transition ``t``, or None when the
storage keeps no info keys (gymnasium-robotics' Fetch envs ignore it)."""

SuccessFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``compute_success(achieved_goal [N, *g], desired_goal [N, *g]) -> bool [N]``."""


@dataclass
class Batch:
    """A sampled batch; all arrays have leading dimension B.

    Attributes:
        observation: float32 [B, *obs] state s_t.
        desired_goal: float32 [B, *g] goal the transition is trained with (relabeled or not); None goal-free.
        action: float32 [B, *act].
        reward: float32 [B] (n-step) return ``sum_{j<m} gamma^j r_{t+j}``, rewards recomputed for the goal.
        next_observation: float32 [B, *obs] bootstrap state s_{t+m}.
        discount: float32 [B] ``gamma^m``, the discount of the bootstrap value.
        terminated: bool [B] s_{t+m} is a true terminal state (no bootstrapping).
        weight: float32 [B] importance-sampling weights (ones without prioritized replay).
        index: int64 [B] storage slots, for ``update_priorities``.
        relabeled: bool [B] the goal was relabeled.
        n_steps: int64 [B] the window length m.
    """

    observation: np.ndarray
    desired_goal: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray
    next_observation: np.ndarray
    discount: np.ndarray
    terminated: np.ndarray
    weight: np.ndarray
    index: np.ndarray
    relabeled: np.ndarray
    n_steps: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    #: the fields a learner needs; ``index``, ``relabeled`` and ``n_steps`` stay numpy (priorities, diagnostics)
    TRAINING_FIELDS = ("observation", "desired_goal", "action", "reward", "next_observation", "discount",
                       "terminated", "weight")

    def to_torch(self, device: Any = None) -> dict[str, Any]:
        """The training fields as torch tensors (``torch.from_numpy``: zero-copy on the CPU), moved to ``device``.

        Torch is imported here only; ``her`` itself never needs it.
        """
        torch = _torch()
        out = {}
        for name in self.TRAINING_FIELDS:
            v = getattr(self, name)
            if v is not None:
                t = torch.from_numpy(v)
                out[name] = t if device is None else t.to(device, non_blocking=True)
        return out


def _torch() -> Any:
    """The torch module, imported on first use (``import torch`` in a function costs ~0.5 us a call)."""
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = torch
    return _TORCH


_TORCH: Any = None


def check_compute_reward(compute_reward: RewardFn, goal_shape: tuple[int, ...], info: Any = None) -> None:
    """Refuse a reward function that is not vectorized over a batch of goals.

    Raises:
        TypeError: compute_reward is not callable.
        ValueError: it fails on, or returns a shape other than (7,) for, 7 goals of ``goal_shape``.
    """
    if not callable(compute_reward):
        raise TypeError(f"compute_reward must be callable, got {type(compute_reward).__name__}")
    g = np.zeros((7, *goal_shape), np.float32)
    try:
        r = np.asarray(compute_reward(g, g + 1.0, info))
    except Exception as exc:
        raise ValueError(
            "compute_reward must be vectorized: compute_reward(achieved_goal [N, *g], desired_goal [N, *g], info) "
            f"-> [N]; calling it with 7 goals of shape {goal_shape} failed: {exc!r}"
        ) from exc
    if r.shape != (7,):
        raise ValueError(
            "compute_reward must be vectorized: for 7 goals it must return shape (7,), "
            f"got shape {r.shape}"
        )


class HerReplayBuffer:
    """HER replay over an ``EpisodeStorage``: sample transitions, relabel goals, build (n-step) returns.

    Args:
        storage: the ``EpisodeStorage``.
        compute_reward: vectorized reward function (see ``RewardFn``); required for goal storages, checked at
            set-up. Every sampled reward is recomputed with it, real and relabeled, in one call per batch.
        strategy: relabel strategy "future", "final" or "episode" (goal storages).
        n_sampled_goal: k; relabel probability k / (k + 1). 0 disables relabeling.
        n_step: n >= 1. The return of transition t with goal g' is ``sum_{j<m} gamma^j r_{t+j}`` with
            ``m = min(n, T - t, steps to the first termination)``, bootstrapped from ``s_{t+m}`` with discount
            ``gamma^m`` unless terminated (Peng & Williams 1996; Hessel et al. 2018, Sec. 3). The goal stays
            ``g'`` over the whole window and every reward in it is recomputed for ``g'``.
        gamma: discount factor in (0, 1].
        sampler: ``UniformSampler`` (default) or ``PrioritizedSampler`` over the same storage.
        stop_at_success: end the n-step window at the first step whose next state achieves the goal (the
            bias-reduced variant of Yang et al. 2021, "Bias-reduced multi-step hindsight experience replay");
            needs ``compute_success``.
        compute_success: vectorized success function (see ``SuccessFn``).
        seed: seed of the buffer's numpy Generator.

    Raises:
        ValueError / TypeError: inconsistent arguments, a non-vectorized compute_reward.
    """

    def __init__(
        self,
        storage: EpisodeStorage,
        compute_reward: RewardFn | None = None,
        *,
        strategy: str = "future",
        n_sampled_goal: int = 4,
        n_step: int = 1,
        gamma: float = 0.98,
        sampler: UniformSampler | PrioritizedSampler | None = None,
        stop_at_success: bool = False,
        compute_success: SuccessFn | None = None,
        seed: int | None = None,
    ) -> None:
        if isinstance(n_step, bool) or int(n_step) != n_step or n_step < 1:
            raise ValueError(f"n_step must be an integer >= 1, got {n_step!r}")
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.storage = storage
        self.n_step, self.gamma = int(n_step), float(gamma)
        relabeler = GoalRelabeler(strategy, n_sampled_goal)  # checks strategy and k, goal storage or not
        self.relabeler = relabeler if storage.has_goals else None
        if storage.has_goals:
            if compute_reward is None:
                raise ValueError("a goal storage needs compute_reward(achieved_goal, desired_goal, info)")
            info0 = {k: np.zeros((7, *s), np.float32) for k, s in storage.info_shapes.items()} or None
            check_compute_reward(compute_reward, storage.goal_shape, info0)
        if stop_at_success and (compute_success is None or not storage.has_goals):
            raise ValueError("stop_at_success needs a goal storage and compute_success(achieved_goal, desired_goal)")
        self.compute_reward = compute_reward
        self.compute_success = compute_success
        self.stop_at_success = bool(stop_at_success)
        self.sampler = sampler if sampler is not None else UniformSampler(storage)
        if self.sampler.storage is not storage:
            raise ValueError("the sampler must be built over the same storage")
        self.rng = np.random.default_rng(seed)
        self._powers = (self.gamma ** np.arange(self.n_step + 1)).astype(np.float32)
        self._window = np.arange(self.n_step)

    # -- writing (delegates)
    def add(self, *args: Any, **kwargs: Any) -> list[tuple[int, int]]:
        """``EpisodeStorage.add``: one step of every env."""
        return self.storage.add(*args, **kwargs)

    def add_episode(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        """``EpisodeStorage.add_episode``: one complete episode."""
        return self.storage.add_episode(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.storage)

    # -- sampling
    def sample(self, batch_size: int) -> Batch:
        """Draw a batch: transitions (uniform or prioritized) -> goals -> returns.

        Raises:
            ValueError: batch_size not an integer >= 1, or nothing sampleable yet.
        """
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        slots, weight, records = self.sampler.sample(int(batch_size), self.rng)
        return self._build(slots, weight, records)

    def batch_from_slots(self, slots: np.ndarray) -> Batch:
        """Build a batch (with relabeling and returns) for given transition slots, weights 1.

        Used e.g. to feed the normalizer with relabeled transitions of new episodes.
        """
        slots = np.asarray(slots)
        n_slots = self.storage.n_slots
        if slots.dtype.kind not in "iu" or (slots.size and not 0 <= slots.min() <= slots.max() < n_slots):
            raise ValueError(f"batch_from_slots: slots must be integers in [0, {n_slots}), got {slots!r}")
        slots = slots.astype(np.int64, copy=False)
        if not self.storage.is_transition(slots).all():
            raise ValueError("batch_from_slots: some slots hold no stored transition")
        return self._build(slots, filled(len(slots), 1.0, "float32"), self.storage.data.take(slots))

    def update_priorities(self, index: np.ndarray, td_error: np.ndarray) -> None:
        """Pass the TD errors of a trained batch to the sampler (a no-op for uniform sampling)."""
        self.sampler.update_priorities(index, td_error)

    def _build(self, slots: np.ndarray, weight: np.ndarray, rec: np.ndarray) -> Batch:
        # Bound by numpy call overhead and cache misses: one record gather per state, few numpy calls.
        st, n, B = self.storage, self.n_step, len(slots)
        nxt = slots + 1  # take(mode="wrap") applies the ring's modulo in C
        if self.relabeler is not None:
            goals, relabeled = self.relabeler.relabel(st, slots, rec, self.rng, nxt)
        else:
            goals, relabeled = None, np.zeros(B, bool)
        if n == 1:
            nrec = st.data.take(nxt, mode="wrap")
            if goals is not None:
                info = {k: rec["info." + k] for k in st.info_shapes} if st.info_shapes else None
                r = self._rewards(rec["next_achieved_goal"], goals, info, B)
            else:
                r = rec["reward"]
            m, discount = filled(B, 1, "int64"), filled(B, self.gamma, "float32")
            ret = r
            terminated = rec["terminated"]
        else:
            left = rec["length"] - rec["step"]  # transitions from t to the episode's end, >= 1
            valid = self._window < left[:, None]  # [B, n] the window's steps inside the episode (a prefix)
            flat_next = (slots[:, None] + (self._window + 1)).reshape(-1)  # states s_{t+1..t+n}, modulo by take
            wrec = None
            if st.info_shapes or goals is None:  # per-step info (or stored rewards) of transitions t..t+n-1
                wrec = st.data.take(flat_next - 1, mode="wrap")
            if goals is not None:
                ag_next = st.achieved_goal.take(flat_next, axis=0, mode="wrap")
                g_rep = np.repeat(goals, n, axis=0)
                info = {k: wrec["info." + k] for k in st.info_shapes}
                r = self._rewards(ag_next, g_rep, info, B * n).reshape(B, n)
                if self.stop_at_success:
                    hit = np.asarray(self.compute_success(ag_next, g_rep), bool).reshape(B, n) & valid
                    first = np.where(hit.any(1), hit.argmax(1), n)
                    valid &= self._window <= first[:, None]
            else:
                r = wrec["reward"].reshape(B, n)
            m = valid.sum(1) if self.stop_at_success else np.minimum(left, n).astype(np.int64)
            ret = np.where(valid, r, np.float32(0.0)) @ self._powers[:n]
            discount = self._powers[m]
            nxt = slots + m
            nrec = st.data.take(nxt, mode="wrap")
            # The window ends in a true terminal state only at its episode's last transition.
            terminated = rec["episode_terminated"] & (m == left)
        # Fields are strided views of the freshly gathered records (no copies; torch.from_numpy accepts them).
        return Batch(
            observation=rec["observation"],
            desired_goal=goals,
            action=rec["action"],
            reward=ret if ret.dtype == np.float32 else ret.astype(np.float32),
            next_observation=nrec["observation"],
            discount=discount,
            terminated=terminated,
            weight=weight,
            index=slots,
            relabeled=relabeled,
            n_steps=m,
        )

    def _rewards(self, achieved_goal: np.ndarray, goals: np.ndarray, info: dict, N: int) -> np.ndarray:
        r = np.asarray(self.compute_reward(achieved_goal, goals, info or None), np.float32)
        if r.shape != (N,):
            raise ValueError(f"compute_reward returned shape {r.shape}, expected ({N},)")
        return r

    # -- persistence
    def state_dict(self) -> dict[str, Any]:
        """Storage, sampler priorities and the RNG state."""
        return {"storage": self.storage.state_dict(), "sampler": self.sampler.state_dict(),
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])
        self.rng.bit_generator.state = state["rng"]

"""Transition samplers: which transitions are drawn. Semantics: ``docs/semantics.md``.

A sampler returns slots of stored transitions and their importance-sampling weights. ``UniformSampler`` draws
uniformly over all stored transitions; ``PrioritizedSampler`` draws in proportion to priorities (Schaul et al.
2016, "Prioritized Experience Replay", Sec. 3.3 and 3.4); ``EnergySampler`` draws whole episodes in proportion to
the energy their achieved goal (an object's position) gained (Zhao & Tresp 2018). Any object with the
[`Sampler`][her.samplers.Sampler] methods plugs into ``HerReplayBuffer``.

This module holds the protocol and the uniform sampler; the prioritized samplers live in their own modules
(``her/prioritized.py``, ``her/energy.py``) and are importable from here as well.

The storage is an argument of every call (``sample(storage, batch_size, rng)``, ``on_added(storage, slots)``),
never of the constructor, so a sampler is built (and its settings checked) without one. A sampler with state per
slot (priorities) is bound to one storage by ``attach(storage)``, which ``HerReplayBuffer`` calls.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import numpy as np

from ._util import filled
from .energy import EnergySampler, trajectory_energy
from .prioritized import PrioritizedSampler
from .storage import EpisodeStorage, check_is_storage

__all__ = ["EnergySampler", "PrioritizedSampler", "Sampler", "UniformSampler", "trajectory_energy"]


@runtime_checkable
class Sampler(Protocol):
    """Which stored transitions a batch holds, and their importance-sampling weights.

    ``HerReplayBuffer`` calls ``attach(storage)`` once, then ``sample(storage, batch_size, rng)`` per batch. The
    storage calls ``on_added`` / ``on_removed`` of an attached sampler that registered itself
    (``storage.add_listener``) when transitions enter or leave it.
    """

    prioritized: bool

    def attach(self, storage: EpisodeStorage) -> None:
        """Prepare for ``storage`` (size per-slot state, register as its listener). Raises ValueError when the
        sampler already serves another storage."""
        ...

    def sample(self, storage: EpisodeStorage, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(slots int64 [B], weights float32 [B])`` of ``batch_size`` stored transitions of ``storage`` (slots
        where ``storage.is_transition``). Raises ValueError when nothing is sampleable."""
        ...

    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions ``slots`` (int64 [N]) entered ``storage``."""
        ...

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        """Transitions ``slots`` (int64 [N]) left ``storage``."""
        ...

    def update_priorities(self, slots: np.ndarray, td_error: np.ndarray) -> None:
        """TD errors of the trained batch; ``HerReplayBuffer`` calls it only when ``prioritized`` is True (and
        raises ValueError otherwise)."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class UniformSampler:
    """Uniform draws over the sampleable transitions of an ``EpisodeStorage``. Stateless: one instance serves
    any storage, ``attach`` only checks the type.

    Weights are all ones. ``update_priorities`` raises ValueError: priorities would be ignored, and a silent
    no-op hides a prioritized replay that was meant but not built (a loop for either sampler calls it only when
    ``sampler.prioritized`` / ``buffer.prioritized``).
    """

    prioritized = False

    def attach(self, storage: EpisodeStorage) -> None:
        """Check ``storage`` (nothing is kept).

        Raises:
            TypeError: not an ``EpisodeStorage``.
        """
        check_is_storage(storage)

    def on_added(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        pass

    def on_removed(self, storage: EpisodeStorage, slots: np.ndarray) -> None:
        pass

    def sample(self, storage: EpisodeStorage, batch_size: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``batch_size`` transition slots of ``storage``.

        Returns:
            slots: int64 [B]; weights: float32 [B] of ones.
        Raises:
            ValueError: no complete episode is stored yet.
        """
        if storage.n_transitions == 0:
            raise ValueError("cannot sample: the storage holds no complete episode yet (steps of unfinished "
                             "episodes are not sampleable)")
        # Rejection sampling over the live state slots (contiguous in the ring): draw a few more candidates than
        # needed, keep the ones that start a transition (not an episode's last state), in draw order, take the
        # first B. Uniform over transitions; a shortfall (rare) draws again.
        slots = self._accepted(storage, batch_size, rng)
        while len(slots) < batch_size:
            slots = np.concatenate([slots, self._accepted(storage, batch_size - len(slots), rng)])
        slots = slots[:batch_size]
        return slots, filled(batch_size, 1.0, "float32")

    @staticmethod
    def _accepted(st: EpisodeStorage, need: int, rng: np.random.Generator) -> np.ndarray:
        base, n_live = st.oldest_slot, st.n_live_states
        accept = st.n_transitions / n_live
        extra = 3.0 * math.sqrt(need * (1.0 - accept)) / accept + 8.0  # 3 sigma of the rejected count, and some
        cand = (rng.random(int(need / accept + extra)) * n_live).astype(np.int64)
        cand += base
        if base + n_live > st.n_slots:  # st.wraps, inlined: property calls are a visible share of this call
            cand %= st.n_slots
        return cand[st.sampleable.take(cand)]

    def update_priorities(self, slots: np.ndarray, td_error: np.ndarray) -> None:
        """Refused: uniform sampling has no priorities.

        Raises:
            ValueError: always.
        """
        raise ValueError("update_priorities: a UniformSampler has no priorities; use her.PrioritizedSampler() "
                         "for prioritized replay, or skip the call when not sampler.prioritized")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __repr__(self) -> str:
        return "UniformSampler()"

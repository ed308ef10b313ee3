"""Per-env staging of the steps a ``HerTorchRLReplayBuffer`` receives, until their episode ends.

TorchRL hands over chunks of steps (``extend`` of ``[n_envs, T]``, ``add`` of one step) that cut episodes
anywhere; the storage takes complete episodes only. ``EpisodeStaging`` keeps each env's unfinished episode as a
list of chunks and hands the whole episode to ``HerReplayBuffer.add_episode`` when it ends. numpy only: the
arrays come already read from the TensorDicts (``her/torchrl_tensordict.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .buffer import HerReplayBuffer

__all__ = ["STATE_KEYS", "EpisodeStaging"]

#: the state fields stored once per state slot; a step carries them for ``s_t`` and (``next_``) for ``s_{t+1}``
STATE_KEYS = ("observation", "achieved_goal", "desired_goal")


class EpisodeStaging:
    """The unfinished episodes of ``n_envs`` envs, written into ``her`` (its storage) whole when they end.

    Args:
        her: the buffer whose ``add_episode`` stores the complete episodes.
        n_envs: number of envs whose steps arrive together.
        capacity: transitions the storage holds; an episode that passes it without ending is refused.
        info_names: names of the per-step info arrays (``"info.<name>"`` in the step arrays).
    """

    def __init__(self, her: HerReplayBuffer, n_envs: int, capacity: int, info_names: Sequence[str]) -> None:
        self.her, self.capacity, self.info_names = her, capacity, tuple(info_names)
        self._pending: list[list[dict[str, np.ndarray]]] = [[] for _ in range(n_envs)]
        self._pending_len = [0] * n_envs
        self._too_long = [False] * n_envs

    def write(self, arrays: dict[str, np.ndarray], term: np.ndarray, trunc: np.ndarray) -> np.ndarray:
        """Stage steps of every env; store the episodes that end in them.

        Args:
            arrays: ``{field: [n_envs, T, ...]}`` of the steps (``observation``, ``next_observation``, ...,
                ``action``, ``reward``, ``info.<name>``), shapes checked by the caller.
            term, trunc: bool [n_envs, T]: the step ended its episode by a true termination / a time limit.

        Returns:
            int64 [N]: storage slots of the transitions stored by this call (episodes that ended in it).

        Raises:
            ValueError: an episode the storage refuses (NaN/inf, ...) or one that passed ``capacity`` without
                ending; the other envs' episodes are stored all the same, the first error is raised at the end.
        """
        n, T = term.shape
        n_slots = self.her.storage.n_slots
        done = term | trunc
        episodes, tails = [], []
        for e in range(n):
            if self._pending_len[e] and not self._continues(e, arrays):
                self._drop(e)
            start = 0
            for end in np.flatnonzero(done[e]).tolist():
                episodes.append((int(end), e, start))
                start = int(end) + 1
            tails.append((e, start))
        episodes.sort()  # in the order they end (envs in order at a tie): as her.EpisodeStorage.add stores them
        stored, error = [], None
        for end, e, start in episodes:
            parts = [{k: a[e, start:end + 1] for k, a in arrays.items()}]
            if start == 0:
                parts = self._pending[e] + parts
                too_long = self._too_long[e]
                self._drop(e)
                if too_long:  # refused already: its remaining steps are dropped up to its end
                    continue
            try:
                s, length = self._store(parts, bool(term[e, end]))
                stored.append((s + np.arange(length)) % n_slots)
            except ValueError as exc:
                error = error or exc
        for e, start in tails:
            if start < T and not self._too_long[e]:
                self._pending[e].append({k: np.array(a[e, start:], np.float32) for k, a in arrays.items()})
                self._pending_len[e] += T - start
                if self._pending_len[e] > self.capacity:
                    self._drop(e)
                    self._too_long[e] = True
                    error = error or ValueError(
                        f"env {e}: episode passed the storage capacity of {self.capacity} transitions without "
                        "ending; raise `capacity` or end episodes sooner")
        if error is not None:
            raise error
        return np.concatenate(stored) if stored else np.zeros(0, np.int64)

    def _continues(self, e: int, arrays: dict[str, np.ndarray]) -> bool:
        """Whether env ``e``'s first step here starts from the staged episode's last state (else the env was
        reset, e.g. by ``collector.reset()``, and the staged episode is dropped)."""
        last = self._pending[e][-1]
        return all(np.array_equal(np.asarray(arrays[k][e, 0], np.float32), last["next_" + k][-1])
                   for k in STATE_KEYS)

    def _drop(self, e: int) -> None:
        self._pending[e] = []
        self._pending_len[e] = 0
        self._too_long[e] = False

    def _store(self, parts: list[dict[str, np.ndarray]], terminated: bool) -> tuple[int, int]:
        cat = (lambda k: parts[0][k]) if len(parts) == 1 else (lambda k: np.concatenate([p[k] for p in parts]))
        states = {k: np.concatenate([parts[0][k][:1], cat("next_" + k)]) for k in STATE_KEYS}
        info = {k: cat("info." + k) for k in self.info_names}
        return self.her.add_episode(states["observation"], cat("action"), cat("reward"),
                                    achieved_goal=states["achieved_goal"], desired_goal=states["desired_goal"],
                                    terminated=terminated, info=info)

"""TorchRL adapter: ``her``'s episode storage and HER sampler behind TorchRL's replay-buffer interface.

The replay underneath (storage, sampling, relabeling, returns) follows ``docs/semantics.md``; this docstring
adds what is particular to TorchRL. Page with an example: ``docs/torchrl.md``.

Optional: this module imports ``torch`` and ``tensordict`` (``pip install -e ".[torchrl]"`` installs them with
``torchrl``); ``import her`` does not import it. Use it where a TorchRL ``ReplayBuffer`` goes: fill it with the TensorDicts a
collector or env produces, sample TensorDicts for TorchRL's loss modules (``SACLoss``, ``TD3Loss``,
``DDPGLoss``, ``DQNLoss``)::

    from her.torchrl import HerTorchRLReplayBuffer

    rb = HerTorchRLReplayBuffer(1_000_000, compute_reward, batch_size=256, strategy="future", n_sampled_goal=4)
    for data in collector:                  # [T] or [n_envs, T]: root and ("next", ...) keys
        rb.extend(data)
        batch = rb.sample()                 # [B]: relabeled goals, recomputed rewards, "index", "priority_weight"
        loss_td = loss_module(batch)        # writes "td_error" into batch
        rb.update_tensordict_priority(batch)

Writing (``extend`` / ``add``):

- Keys read (names configurable): at the root ``observation``, ``achieved_goal``, ``desired_goal`` (state
  ``s_t``) and ``action``; under ``"next"`` the same three state keys (``s_{t+1}``, the *real* next state, which
  TorchRL's collectors keep there also when an env is reset), ``reward`` ([..., 1] or [...]), ``done``,
  ``terminated``, ``truncated``. Either ``terminated`` or ``done`` must be present: without ``terminated`` every
  ``done`` is a true termination unless ``truncated`` says otherwise; without ``truncated`` an end that is not a
  termination is a time-limit end. Other keys (policy outputs, ``collector``, ``step_count``, ...) are not stored.
- Batch layout: the *last* batch dimension is time. ``extend(td)`` takes ``[T]`` (one env) or ``[*env_dims, T]``
  (a batched env's collector output, ``[n_envs, T]``: each env's steps stay in their own episode);
  ``add(td)`` takes one step, ``[]`` or ``[*env_dims]`` (what ``env.step`` returns). Do not ``reshape(-1)`` a
  batched collector's output: that interleaves envs (it is refused when ``("collector", "traj_ids")`` shows it).
- Steps are staged per env and stored when their episode ends (``done``): only complete episodes are sampled,
  ``len(rb)`` counts their transitions and ``rb.write_count`` every step received. An episode may span any number
  of ``extend`` calls. When an env's next step does not continue its staged episode (its state differs from the
  staged last state, e.g. after ``collector.reset()``), the unfinished episode is dropped.
- Values are stored as float32 (observations, goals, actions, rewards, the ``info_keys`` entries); the number
  of envs and the shapes are fixed by the first write (or given at construction).

What ``sample(batch_size)`` returns: a ``TensorDict`` of batch size ``[B]`` on ``device`` with

- ``observation`` / ``achieved_goal`` [B, *shape] float32: ``s_t``; ``desired_goal``: the goal the transition is
  trained with (relabeled or not), the same under ``"next"``; ``action`` [B, *act] float32;
- ``("next", observation | achieved_goal)``: the bootstrap state ``s_{t+m}`` (``m = 1`` unless ``n_step > 1``);
- ``("next", "reward")`` [B, 1] float32: recomputed with ``compute_reward`` for that goal; with ``n_step > 1``
  the n-step return ``sum_{j<m} gamma^j r_{t+j}``;
- ``("next", "terminated")`` [B, 1] bool: ``s_{t+m}`` is a true terminal state (no bootstrapping);
  ``("next", "done")``: ``s_{t+m}`` ends its episode (terminated or time limit); ``("next", "truncated")``:
  done and not terminated; the root ``done`` / ``terminated`` / ``truncated`` are False (``s_t`` never ends);
- ``"steps_to_next_obs"`` [B, 1] int64 (``m``) and ``"gamma"`` [B, 1] float32 (``gamma ** m``): TorchRL's
  n-step keys (as ``MultiStepTransform`` writes them); its value estimators bootstrap with
  ``loss_gamma ** steps_to_next_obs``, so give the loss the buffer's ``gamma``;
- ``"priority_weight"`` [B] float32: importance-sampling weights (ones without ``prioritized``), which TorchRL's
  losses read by default; ``"index"`` [B] int64: storage slots for ``update_priority``; ``"relabeled"`` [B] bool.

Prioritized replay (``prioritized=True``): ``update_tensordict_priority(td)`` reads ``td["index"]`` and
``td[priority_key]`` (``"td_error"``, what TorchRL's losses write), ``update_priority(index, priority)`` takes
them directly; the priority is ``(|td_error| + eps) ** alpha`` (``her.PrioritizedSampler``; several values per
transition are reduced by their max, as TorchRL's ``PrioritizedSampler`` does). Without ``prioritized`` both
calls check their arguments and change nothing, as TorchRL's uniform buffers ignore them (one loop serves both).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    from tensordict import TensorDictBase
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "her.torchrl needs torch and tensordict: pip install -e '.[torchrl]' (installs them with torchrl==0.14.1). "
        "The rest of `her` (EpisodeStorage, HerReplayBuffer, samplers) works without them."
    ) from exc

from ._util import positive_int
from .buffer import HerReplayBuffer
from .returns import RewardFn
from .samplers import PrioritizedSampler, UniformSampler
from .storage import EpisodeStorage
from .torchrl_dump import read_dump, write_dump
from .torchrl_staging import EpisodeStaging
from .torchrl_tensordict import NestedKey, TensorDictLayout, as_key, to_numpy

__all__ = ["HerTorchRLReplayBuffer"]


class HerTorchRLReplayBuffer:
    """A TorchRL-style replay buffer backed by ``her.EpisodeStorage`` + ``her.HerReplayBuffer``.

    Duck-typed to TorchRL's ``TensorDictReplayBuffer`` / ``TensorDictPrioritizedReplayBuffer`` (``extend``,
    ``add``, ``sample``, ``update_priority``, ``update_tensordict_priority``, ``len``, ``rb[index]``,
    ``write_count``, ``batch_size``, iteration, ``empty``, ``state_dict``, ``dumps`` / ``loads``): TorchRL's
    collectors accept it as ``replay_buffer=``.
    See the module docstring for the keys, shapes and semantics.

    Args:
        capacity: transitions kept (whole oldest episodes are dropped), over all envs.
        compute_reward: vectorized ``compute_reward(achieved_goal [N, *g], desired_goal [N, *g], info) -> [N]``
            on numpy arrays (a gymnasium-robotics env's ``compute_reward``); ``info`` is None, or
            ``{name: [N, *shape]}`` of ``info_keys``.
        batch_size: default batch size of ``sample()`` and iteration.
        strategy: "future", "final", "episode" or "mixed" (``her.make_relabeler``).
        n_sampled_goal: k; relabel probability k / (k + 1); 0 disables HER.
        n_step: n-step returns (see ``steps_to_next_obs`` / ``gamma`` in the module docstring).
        gamma: discount of the n-step return; give TorchRL's loss / value estimator the same.
        prioritized: proportional prioritized replay (``her.PrioritizedSampler``).
        alpha: priority exponent.
        beta: initial importance-sampling exponent.
        eps: priority offset.
        beta_annealing_steps: ``sample`` calls over which beta rises linearly to 1 (0: constant).
        td_error_clip: optional upper clip of ``|td_error|`` before it becomes a priority.
        priority_key: key of the TD errors read by ``update_tensordict_priority`` (TorchRL's ``"td_error"``).
        observation_key: key of the observation (read at the root and under ``"next"``).
        achieved_goal_key: key of the achieved goal (read at the root and under ``"next"``).
        desired_goal_key: key of the desired goal (read at the root and under ``"next"``).
        action_key: key of the action.
        reward_key: key of the reward, under ``"next"``.
        done_key: key of the done flag, under ``"next"``.
        terminated_key: key of the terminated flag, under ``"next"``.
        truncated_key: key of the truncated flag, under ``"next"``.
        info_keys: ``{name: key}`` of per-step entries (under the root, e.g. ``("next", "is_success")``) stored and
            passed to ``compute_reward`` as ``info={name: [N, *shape]}``.
        max_episode_steps: the usual episode length (longer episodes still fit; sizes the storage's ring).
        observation_shape: shape of one observation; default: taken from the first write.
        goal_shape: shape of one goal; default: taken from the first write.
        action_shape: shape of one action; default: taken from the first write.
        device: device of the sampled TensorDicts.
        transform: optional callable applied to each sampled TensorDict (as ``ReplayBuffer(transform=...)``).
        seed: seed of the sampler's numpy Generator (None: random).
        validate: check shapes and NaN/inf of every stored episode.
        **her_kwargs: more ``her.HerReplayBuffer`` arguments (``other_desired_fraction``, ``stop_at_success``,
            ``compute_success``, ``relabeler``, ``returns``, ...).

    Raises:
        ValueError: bad sizes or settings (from ``her.EpisodeStorage`` / ``her.HerReplayBuffer``), a
            non-vectorized ``compute_reward`` (checked when the storage is built).
    """

    def __init__(
        self,
        capacity: int,
        compute_reward: RewardFn,
        *,
        batch_size: int | None = None,
        strategy: str = "future",
        n_sampled_goal: int = 4,
        n_step: int = 1,
        gamma: float = 0.98,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        beta_annealing_steps: int = 0,
        td_error_clip: float | None = None,
        priority_key: NestedKey = "td_error",
        observation_key: NestedKey = "observation",
        achieved_goal_key: NestedKey = "achieved_goal",
        desired_goal_key: NestedKey = "desired_goal",
        action_key: NestedKey = "action",
        reward_key: NestedKey = "reward",
        done_key: NestedKey = "done",
        terminated_key: NestedKey = "terminated",
        truncated_key: NestedKey = "truncated",
        info_keys: Mapping[str, NestedKey] | None = None,
        max_episode_steps: int = 50,
        observation_shape: Sequence[int] | None = None,
        goal_shape: Sequence[int] | None = None,
        action_shape: Sequence[int] | None = None,
        device: Any = "cpu",
        transform: Callable[[TensorDictBase], TensorDictBase] | None = None,
        seed: int | None = None,
        validate: bool = True,
        **her_kwargs: Any,
    ) -> None:
        if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1 or None, got {batch_size!r}")
        if not callable(compute_reward):
            raise TypeError(f"compute_reward must be callable, got {type(compute_reward).__name__}")
        self.capacity = positive_int(capacity, "capacity")
        self.compute_reward = compute_reward
        self._batch_size = None if batch_size is None else int(batch_size)
        self.prioritized = bool(prioritized)
        self._sampler_kwargs: dict[str, Any] = dict(alpha=alpha, beta0=beta, eps=eps, beta_annealing_steps=beta_annealing_steps,
                                    td_error_clip=td_error_clip)
        self._her_kwargs = dict(strategy=strategy, n_sampled_goal=n_sampled_goal, n_step=n_step, gamma=gamma,
                                seed=seed, **her_kwargs)
        self.priority_key = as_key(priority_key)
        self.layout = TensorDictLayout(observation_key, achieved_goal_key, desired_goal_key, action_key, reward_key,
                                       done_key, terminated_key, truncated_key, info_keys)
        self.keys, self.next_keys, self.info_keys = self.layout.keys, self.layout.next_keys, self.layout.info_keys
        self.max_episode_steps = positive_int(max_episode_steps, "max_episode_steps")
        self.device = torch.device(device)
        self.transform = transform
        self.validate = validate
        shapes = (observation_shape, goal_shape, action_shape)
        if any(s is not None for s in shapes) and (any(s is None for s in shapes) or self.info_keys):
            raise ValueError("give observation_shape, goal_shape and action_shape together (and no info_keys, "
                             "whose shapes come from the first write), or none of them")
        self._check_arguments()
        self.storage: EpisodeStorage | None = None
        self.her: HerReplayBuffer | None = None
        self.n_envs: int | None = None
        self._staging: EpisodeStaging | None = None  # built with the storage
        self._write_count = 0
        if observation_shape is not None:
            assert goal_shape is not None and action_shape is not None  # all or none: checked above
            self._build(tuple(observation_shape), tuple(goal_shape), tuple(action_shape), {})

    # ------------------------------------------------------------------ set-up
    def _build(self, obs_shape: tuple[int, ...], goal_shape: tuple[int, ...] | None, action_shape: tuple[int, ...],
               info_shapes: dict[str, tuple[int, ...]]) -> None:
        self.storage = EpisodeStorage(self.capacity, obs_shape, action_shape, goal_shape,
                                      max_episode_steps=self.max_episode_steps, info_shapes=info_shapes,
                                      validate=self.validate)
        sampler = PrioritizedSampler(**self._sampler_kwargs) if self.prioritized else UniformSampler()
        self.her = HerReplayBuffer(self.storage, self.compute_reward, sampler=sampler, **self._her_kwargs)
        self._reset_staging()

    def _check_arguments(self) -> None:
        """Check the sampler and HER arguments now, as ``_build`` would at the first write (the shapes
        come from the data): a bad argument is refused by the constructor, not after a collection.

        Raises:
            ValueError, TypeError: naming the argument, as ``PrioritizedSampler`` and
                ``HerReplayBuffer`` do."""
        sampler = PrioritizedSampler(**self._sampler_kwargs) if self.prioritized else UniformSampler()
        probe = EpisodeStorage(1, (1,), (1,), (1,), max_episode_steps=1)  # the compute_reward probe: shape-free
        HerReplayBuffer(probe, lambda ag, dg, info: np.zeros(len(ag), np.float32), sampler=sampler,
                        **self._her_kwargs)

    def _reset_staging(self) -> None:
        assert self.her is not None  # built with the storage
        self._staging = EpisodeStaging(self.her, self.n_envs or 0, self.capacity, list(self.info_keys))

    # ------------------------------------------------------------------ TorchRL interface: queries
    def __len__(self) -> int:
        """Sampleable transitions (of complete episodes)."""
        return 0 if self.storage is None else len(self.storage)

    @property
    def write_count(self) -> int:
        """Steps received by ``extend`` / ``add`` so far (per env step; staged ones included)."""
        return self._write_count

    @property
    def batch_size(self) -> int | None:
        """The default batch size of ``sample()``."""
        return self._batch_size

    def set_batch_size(self, batch_size: int | None) -> None:
        self._batch_size = batch_size

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self.capacity}, stored={len(self)}, "
                f"write_count={self._write_count}, n_envs={self.n_envs}, prioritized={self.prioritized}, "
                f"her={self._her_kwargs})")

    # ------------------------------------------------------------------ writing
    def extend(self, data: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        """Add steps of one or several envs; complete episodes are stored.

        Args:
            data: TensorDict of batch size ``[T]`` (one env) or ``[*env_dims, T]`` (time last, as TorchRL's
                collectors lay it out) with the keys of the module docstring.
            update_priority: accepted for TorchRL compatibility; new transitions get the largest priority seen.

        Returns:
            int64 [N]: storage slots of the transitions stored by this call (episodes that ended in it).

        Raises:
            KeyError: a key is missing (the message names the keys expected).
            ValueError: a zero-dimensional TensorDict (use ``add``), another number of envs than before, shapes
                that differ from the stored ones, a ``reshape(-1)`` of several envs' steps, NaN/inf in an
                episode, an episode longer than ``capacity``. The other envs' episodes are stored all the same.
        """
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"extend takes a TensorDict, got {type(data).__name__}")
        if data.ndim == 0:
            raise ValueError("extend takes a TensorDict with a time dimension ([T] or [*env_dims, T]); "
                             "use add() for one step")
        return self._write(data, one_step=False)

    def add(self, data: TensorDictBase) -> torch.Tensor:
        """Add one step: batch size ``[]`` (one env) or ``[*env_dims]`` (e.g. what a batched ``env.step`` returns).

        Returns and raises as ``extend``.
        """
        if not isinstance(data, TensorDictBase):
            raise TypeError(f"add takes a TensorDict, got {type(data).__name__}")
        return self._write(data, one_step=True)

    def _write(self, data: TensorDictBase, one_step: bool) -> torch.Tensor:
        arrays, term, trunc = self.layout.read(data, one_step)
        n, T = term.shape
        if self.storage is None:
            info_shapes = {k: arrays["info." + k].shape[2:] for k in self.info_keys}
            self.n_envs = n
            self._build(arrays["observation"].shape[2:], arrays["achieved_goal"].shape[2:],
                        arrays["action"].shape[2:], info_shapes)
        elif self.n_envs is None:
            self.n_envs = n
            self._reset_staging()
        if n != self.n_envs:
            raise ValueError(f"HerTorchRLReplayBuffer receives the steps of {self.n_envs} env(s) (fixed by the "
                             f"first write), got a batch of {n} env(s) (batch size {tuple(data.batch_size)})")
        st = self.storage
        assert st is not None  # built above
        expect = {"observation": st.observation_shape, "achieved_goal": st.goal_shape,
                  "desired_goal": st.goal_shape, "action": st.action_shape}
        for name, shp in expect.items():
            for a_name in (name, "next_" + name) if name != "action" else (name,):
                if arrays[a_name].shape[2:] != shp:
                    raise ValueError(f"{a_name}: expected per-step shape {shp}, got {arrays[a_name].shape[2:]}")
        self._write_count += n * T
        assert self._staging is not None  # built with the storage
        return torch.from_numpy(self._staging.write(arrays, term, trunc))

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Draw a HER batch as a TensorDict [B] (keys in the module docstring).

        Args:
            batch_size: B; default the ``batch_size`` given at construction.
            return_info: also return ``{"index": ..., "priority_weight": ...}`` as TorchRL does.

        Raises:
            ValueError: no batch size, or no complete episode stored yet.
        """
        B = self._batch_size if batch_size is None else batch_size
        if B is None:
            raise ValueError("sample() needs a batch_size (here or at construction)")
        if self.her is None or self.storage is None or len(self.storage) == 0:
            raise ValueError("HerTorchRLReplayBuffer: no complete episode stored yet (only whole episodes are "
                             "sampled): collect at least one episode before sampling")
        td = self.layout.sampled(self.her.sample(B), self.storage, self.device)
        if self.transform is not None:
            td = self.transform(td)
        if return_info:
            return td, {"index": td["index"], "priority_weight": td["priority_weight"]}
        return td

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Batches of ``batch_size`` forever (TorchRL's iteration with a random sampler)."""
        if self._batch_size is None:
            raise ValueError("iterating needs batch_size= at construction")
        while True:
            yield self.sample()

    # ------------------------------------------------------------------ priorities
    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of sampled transitions from their TD errors.

        Without ``prioritized`` the arguments are checked and ignored, as TorchRL's uniform buffers ignore the
        call, so one training loop serves both.

        Args:
            index: int [B] (torch or numpy), the ``"index"`` of the sampled TensorDict.
            priority: [B], [B, ...] (reduced by the max over the trailing dims) or a scalar; TD errors, sign
                ignored.

        Raises:
            ValueError: lengths that differ, non-integer indices, NaN/inf priorities.
            IndexError: an index outside the storage (prioritized).
        """
        if self.her is None:
            raise ValueError("update_priority: nothing stored yet")
        idx = to_numpy(index).reshape(-1)
        p = np.abs(to_numpy(priority).astype(np.float64))
        if p.ndim == 0:
            p = np.full(idx.shape, float(p))
        elif p.ndim > 1:
            p = p.reshape(p.shape[0], -1).max(axis=1)
        if idx.dtype.kind not in "iu" or p.shape != idx.shape or not np.isfinite(p).all():
            raise ValueError(f"update_priority: index must be integers [B] and priority [B] (or [B, ...]) finite "
                             f"TD errors; got index {idx.dtype} {idx.shape}, priority {p.shape}")
        if self.prioritized:
            self.her.update_priorities(idx, p)
        # else: TorchRL's uniform buffers ignore priority updates (one loop serves both); checked, then ignored

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """``update_priority(data["index"], data[priority_key])``: the TorchRL loss wrote ``td_error`` into the
        sampled TensorDict.

        Raises:
            KeyError: ``data`` has no ``"index"`` or no priority entry.
        """
        index = data.get("index", None)
        priority = data.get(self.priority_key, None)
        if index is None or priority is None:
            missing = [str(k) for k, v in (("index", index), (self.priority_key, priority)) if v is None]
            raise KeyError(f"update_tensordict_priority: the TensorDict has no {missing} entry (sample from this "
                           "buffer, then run the loss module on the sample, which writes the TD error)")
        self.update_priority(index, priority)

    # ------------------------------------------------------------------ persistence
    def empty(self) -> None:
        """Forget everything stored and staged (the configuration stays)."""
        st = self.storage
        if st is not None:
            self._build(st.observation_shape, st.goal_shape, st.action_shape, dict(st.info_shapes))
        self._write_count = 0

    def state_dict(self) -> dict[str, Any]:
        """Stored episodes, sampler priorities, RNG state, write count (staged, unfinished episodes are not kept:
        after a load the envs restart)."""
        if self.storage is None:
            return {"write_count": self._write_count}
        st = self.storage
        assert self.her is not None  # built with the storage
        return {"her": self.her.state_dict(), "write_count": self._write_count, "n_envs": self.n_envs,
                "shapes": {"observation": st.observation_shape, "goal": st.goal_shape, "action": st.action_shape,
                           "info": dict(st.info_shapes)}}

    def dumps(self, path: str | os.PathLike) -> None:
        """Write ``state_dict`` into the directory ``path`` (created), as TorchRL's ``ReplayBuffer.dumps``:
        ``buffer.npz`` (the arrays; the RNG state as JSON, so nothing is pickled) and ``meta.json`` (format,
        write count, number of envs, shapes). Each file is written atomically (temp file, fsync, rename).

        Raises:
            OSError: ``path`` cannot be written (e.g. it is a file, a full disk).
        """
        write_dump(Path(path), self.state_dict())

    def loads(self, path: str | os.PathLike) -> None:
        """Load what ``dumps`` wrote into ``path`` (TorchRL's ``ReplayBuffer.loads``), without unpickling.

        Raises:
            FileNotFoundError: ``path`` holds no ``meta.json`` / ``buffer.npz`` of a dump.
            ValueError: a damaged dump, one of an unknown format, or of a buffer of another capacity or layout
                (one line naming the file).
        """
        self.load_state_dict(read_dump(Path(path)))

    def __getitem__(self, index: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> TensorDictBase:
        """The stored transitions at ``index`` (into the ``len(rb)`` transitions of the complete episodes, oldest
        first; negative indices count from the end; slices, integer arrays and tensors), as stored: the
        episode's own ``desired_goal`` and the env's reward, 1-step; no relabeling, no sampling RNG used (as
        TorchRL's ``rb[i]`` reads its storage). Keys as ``sample``'s, without ``steps_to_next_obs``,
        ``gamma``, ``priority_weight`` and ``relabeled``; an integer index gives batch size ``[]``.

        Raises:
            IndexError: an index outside ``[-len(rb), len(rb))``.
            TypeError: an index of another kind.
        """
        if self.storage is None:
            raise IndexError("rb[index]: nothing stored yet")
        n = len(self)
        single = isinstance(index, (int, np.integer))
        if isinstance(index, slice):
            pos = np.arange(n)[index]
        elif isinstance(index, torch.Tensor) or isinstance(index, (int, np.integer, np.ndarray, list, tuple)):
            pos = to_numpy(index).reshape(-1)
            if pos.dtype.kind not in "iu":
                raise TypeError(f"rb[index]: expected integers, a slice or an integer tensor, got {pos.dtype}")
            bad = pos[(pos < -n) | (pos >= n)]
            if bad.size:
                raise IndexError(f"rb[{int(bad[0])}]: index out of range for {n} stored transitions")
            pos = pos % max(n, 1)
        else:
            raise TypeError(f"rb[index]: expected an int, a slice, integers or an integer tensor, got "
                            f"{type(index).__name__}")
        td = self.layout.stored(self.storage, self.storage.transition_slots()[pos], self.device)
        return td[0] if single else td

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()``.

        Raises:
            ValueError: saved from a buffer of another capacity or layout.
        """
        self._write_count = int(state["write_count"])
        if "her" not in state:
            return
        s = state["shapes"]
        if self.storage is None:
            self._build(tuple(s["observation"]), tuple(s["goal"]), tuple(s["action"]),
                        {k: tuple(v) for k, v in s["info"].items()})
        self.n_envs = state["n_envs"]
        self._reset_staging()
        assert self.her is not None  # built with the storage
        self.her.load_state_dict(state["her"])

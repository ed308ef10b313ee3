"""The replay buffer: storage -> transitions (uniform | prioritized) -> goals (HER) -> returns (1-step | n-step).

``HerReplayBuffer`` composes the four pieces (``EpisodeStorage``, a [`Sampler`][her.samplers.Sampler], a
[`Relabeler`][her.relabel.Relabeler], a [`Returns`][her.returns.Returns]), owns the ``EpisodeWriter`` that
stages steps
into the storage, and returns ``Batch`` objects of numpy arrays.
Every combination works; goal-free storages skip the relabeling and use the stored rewards. The buffer gathers
each sampled transition's record once and hands it to the pieces. Semantics: ``docs/semantics.md``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._util import filled
from .relabel import Relabeler, RelabelStrategy, make_relabeler
from .returns import Returns, RewardFn, SuccessFn, TerminatedFn, make_returns
from .samplers import Sampler, UniformSampler
from .storage import EpisodeStorage, check_is_storage
from .writer import EpisodeWriter

__all__ = ["Batch", "HerReplayBuffer", "check_compute_reward", "check_goal_fn_signature"]


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
        terminated: bool [B] s_{t+m} is a true terminal state (no bootstrapping): the stored flag, or with
            ``compute_terminated`` the recomputed one for ``desired_goal``.
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
    """The torch module, imported on first use (an ``import`` statement in a hot function is not free)."""
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = torch
    return _TORCH


_TORCH: Any = None


def check_goal_fn_signature(fn: Callable, name: str = "compute_reward") -> None:
    """Refuse a callable that cannot be called as ``fn(achieved_goal, desired_goal, info)`` (three positional
    arguments, the way the buffer calls it), naming ``name`` and the signature it has. Callables whose
    signature cannot be read (some builtins) pass.

    Raises:
        TypeError: not callable, or a signature that does not take three positional arguments.
    """
    if not callable(fn):
        raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None, None, None)
    except TypeError:
        own = getattr(fn, "__qualname__", type(fn).__qualname__).rsplit("<locals>.", 1)[-1]
        raise TypeError(f"{name} must take three positional arguments (achieved_goal, desired_goal, info), got "
                        f"{own}{sig}; add an info parameter (info=None if it is not used)") from None


def check_compute_reward(compute_reward: RewardFn, goal_shape: tuple[int, ...], info: Any = None,
                         name: str = "compute_reward") -> bool:
    """Refuse a reward function that does not take ``(achieved_goal, desired_goal, info)`` or is not vectorized
    over a batch of goals.

    Its signature is read first (``check_goal_fn_signature``). Then it is called with 7 goals of
    ``goal_shape`` (``info``: None or ``{key: [7, ...]}``). When that call raises, it is called once more with one
    unbatched goal: if that works the function is not vectorized and is refused; if that raises too the function
    cannot be probed yet (e.g. an env's ``compute_reward`` that reads state set by its first ``reset``), and the
    check is left to the first real sample, where every batch's shape is checked anyway. ``name``: the name in
    the messages (``"compute_terminated"`` checks that function the same way).

    Returns:
        True when checked, False when it could not be probed yet.

    Raises:
        TypeError: compute_reward is not callable, or does not take three positional arguments.
        ValueError: it fails on 7 goals but works on one, or returns a shape other than (7,) for 7 goals.
    """
    check_goal_fn_signature(compute_reward, name)
    g = np.zeros((7, *goal_shape), np.float32)
    try:
        r = np.asarray(compute_reward(g, g + 1.0, info))
    except Exception as exc:
        one_info = None if info is None else {k: np.asarray(v)[0] for k, v in info.items()}
        try:
            compute_reward(g[0], g[0] + 1.0, one_info)
        except Exception:
            return False  # fails unbatched as well: not (yet) callable here, so nothing is learned about batching
        raise ValueError(
            f"{name} must be vectorized: {name}(achieved_goal [N, *g], desired_goal [N, *g], info) "
            f"-> [N]; calling it with 7 goals of shape {goal_shape} failed: {exc!r}"
        ) from exc
    if r.shape != (7,):
        raise ValueError(f"{name} must be vectorized: for 7 goals it must return shape (7,), got shape {r.shape}")
    return True


def _takes_keyword(fn: Callable, keyword: str) -> bool:
    """Whether ``fn`` accepts ``keyword=`` (True when its signature cannot be read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == keyword and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.kind == p.VAR_KEYWORD
               for p in params)


def _refuse_non_finite(reward: np.ndarray, slots: np.ndarray) -> None:
    """ValueError when a sampled return is NaN or infinite: compute_reward gave NaN/inf for some goal. A dot
    product (NaN and inf propagate; ~1 us, half of a sum's ufunc reduce) is the fast path; the element check
    runs only when it is not finite (also on an overflow of finite values)."""
    if math.isfinite(reward.dot(reward)):
        return
    bad = np.flatnonzero(~np.isfinite(reward))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"compute_reward returned NaN or inf rewards: {bad.size} of {len(reward)} sampled "
                         f"transitions have a non-finite return (first at batch row {i}, storage slot "
                         f"{int(slots[i])}: {reward[i]}); HER cannot learn from them")


class HerReplayBuffer:
    """HER replay over an ``EpisodeStorage``: sample transitions, relabel goals, build (n-step) returns.

    Built from its pieces: ``sampler``, ``relabeler`` and ``returns`` are objects (any class with the methods of
    ``her.Sampler``, ``her.Relabeler``, ``her.Returns``). The shorthand arguments are a thin
    factory over them, nothing more: the relabel ones given (``strategy``, ``n_sampled_goal``,
    ``other_desired_fraction``) go to ``her.make_relabeler``, the return ones (``n_step``, ``gamma``,
    ``stop_at_success``, ``compute_success``) to ``her.make_returns``, and a shorthand left out takes that
    factory's default (the defaults below are theirs). So ``HerReplayBuffer(storage, f, strategy="final",
    n_step=3)`` is ``HerReplayBuffer(storage, f, relabeler=make_relabeler("final"), returns=make_returns(3))``.
    A piece and a shorthand of its own are not given together.

    Args:
        storage: the ``EpisodeStorage``.
        compute_reward: vectorized reward function (see ``RewardFn``); required for goal storages, checked at
            set-up (signature, then a 7-goal probe). Every sampled reward is recomputed with it, real and
            relabeled, in one call per batch; a NaN or inf reward raises ValueError at sampling.
        compute_terminated: optional vectorized termination function (see ``TerminatedFn``, gymnasium-robotics'
            ``GoalEnv.compute_terminated``), checked like compute_reward. When given, the ``terminated`` of every
            sampled transition, real and relabeled, is recomputed for its goal in the same call as the reward
            (so a relabeled success stops bootstrapping, and a real terminal relabeled to a goal it does not
            achieve does not), and an n-step window ends at its first terminal step. None: the stored flags
            (the episode's real end). Pass it for envs that end episodes on success; Fetch never terminates.
        sampler: which transitions; default ``UniformSampler()`` (``PrioritizedSampler()`` for PER). The buffer
            attaches it to ``storage`` (``sampler.attach(storage)``).
        relabeler: which goals (goal storages only); default ``make_relabeler(**the relabel shorthands given)``
            (``FutureGoals(4)`` when none is). A goal-free storage relabels nothing (``relabeler`` None).
        returns: which returns; default ``make_returns(**the return shorthands given)`` (``OneStepReturn(0.98)``
            when none is).
        strategy: shorthand: a ``her.relabel.RelabelStrategy`` or its value "future" (default),
            "final", "episode", "mixed".
        n_sampled_goal: shorthand: k (default 4); relabel probability k / (k + 1). 0 disables relabeling.
        other_desired_fraction: shorthand, strategy "mixed": share of relabeled goals taken from stored desired
            goals (default 0.5).
        n_step: shorthand: n >= 1 (default 1). The return of transition t with goal g' is
            ``sum_{j<m} gamma^j r_{t+j}`` with ``m = min(n, T - t, steps to the first termination)``,
            bootstrapped from ``s_{t+m}`` with discount ``gamma^m`` unless terminated (see ``her.returns``).
        gamma: shorthand: discount factor in (0, 1] (default 0.98).
        stop_at_success: shorthand: end the n-step window at the first step whose next state achieves the goal
            (Yang et al. 2021, "Bias-reduced multi-step hindsight experience replay"); needs ``compute_success``
            (default False).
        compute_success: shorthand: vectorized success function (see ``SuccessFn``).
        seed: seed (an integer >= 0, or None) of the buffer's numpy Generator.

    Attributes:
        writer: the ``EpisodeWriter`` behind [`add`][her.buffer.HerReplayBuffer.add] (``storage.n_envs``
            envs).

    Raises:
        ValueError / TypeError: ``storage`` not an ``EpisodeStorage``, a bad ``seed``, inconsistent arguments, a
            piece and its shorthand both given, a sampler attached to another storage, a non-vectorized compute_reward or compute_terminated (ValueError),
            one that does not take ``(achieved_goal, desired_goal, info)`` (TypeError), compute_terminated for a
            goal-free storage or with a ``returns`` object whose ``build`` does not take it.
    """

    compute_terminated: TerminatedFn | None = None  # class default: buffers pickled before it existed load

    def __init__(
        self,
        storage: EpisodeStorage,
        compute_reward: RewardFn | None = None,
        *,
        sampler: Sampler | None = None,
        relabeler: Relabeler | None = None,
        returns: Returns | None = None,
        strategy: RelabelStrategy | str | None = None,
        n_sampled_goal: int | None = None,
        other_desired_fraction: float | None = None,
        n_step: int | None = None,
        gamma: float | None = None,
        stop_at_success: bool | None = None,
        compute_success: SuccessFn | None = None,
        compute_terminated: TerminatedFn | None = None,
        seed: int | None = None,
    ) -> None:
        check_is_storage(storage)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"seed must be an integer >= 0 or None, got {seed!r}")
        self.storage = storage
        self.writer = EpisodeWriter(storage)
        relabel = _given(strategy=strategy, n_sampled_goal=n_sampled_goal,
                         other_desired_fraction=other_desired_fraction)
        self.sampler = _attached_sampler(storage, sampler)
        self.relabeler = _relabeler(storage, relabeler, relabel)
        self.returns = _piece(returns, "returns", "build(storage, slots, records, goals, compute_reward)",
                              make_returns, _given(n_step=n_step, gamma=gamma, stop_at_success=stop_at_success,
                                                   compute_success=compute_success))
        if storage.goal_shape is not None:
            if compute_reward is None:
                raise ValueError("a goal storage needs compute_reward(achieved_goal, desired_goal, info)")
            info0 = {k: np.zeros((7, *s), np.float32) for k, s in storage.info_shapes.items()} or None
            # False: it could not be probed yet (an env that needs a reset first); sampling checks every shape
            check_compute_reward(compute_reward, storage.goal_shape, info0)
        if compute_terminated is not None:
            if storage.goal_shape is None:
                raise ValueError("compute_terminated needs a goal storage (this one was built without goal_shape: "
                                 "its stored terminated flags are used)")
            if not _takes_keyword(self.returns.build, "compute_terminated"):
                raise TypeError(f"compute_terminated is given, but {type(self.returns).__name__}.build does not "
                                "take compute_terminated=None: add that keyword to it")
            check_compute_reward(compute_terminated, storage.goal_shape, info0, name="compute_terminated")
        self.compute_reward = compute_reward
        self.compute_terminated = compute_terminated
        self.rng = np.random.default_rng(seed)

    @property
    def gamma(self) -> float:
        """The discount factor of the returns."""
        return self.returns.gamma

    @property
    def n_step(self) -> int:
        """The returns' n (1 for a returns object without ``n_step``)."""
        return int(getattr(self.returns, "n_step", 1))

    @property
    def prioritized(self) -> bool:
        """Whether the sampler is prioritized, i.e. whether
        [`update_priorities`][her.buffer.HerReplayBuffer.update_priorities] applies."""
        return bool(getattr(self.sampler, "prioritized", False))

    # -- writing (delegates)
    def add(
        self,
        observation: Mapping[str, np.ndarray] | np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_observation: Mapping[str, np.ndarray] | np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: Mapping[str, np.ndarray] | None = None,
    ) -> list[tuple[int, int]]:
        """One step of every env, through ``writer`` ([`her.EpisodeWriter.add`][]: arguments ``[n_envs,
        ...]``,
        errors); an env's episode is stored when it ends.

        Returns:
            (start slot, T) of each episode stored by this call.
        """
        return self.writer.add(observation, action, reward, next_observation, terminated, truncated, info)

    def discard_in_progress(self, env: int | None = None) -> None:
        """Drop the staged, unfinished episode of one env (or of all envs), e.g. after an env reset."""
        self.writer.discard_in_progress(env)

    def in_progress_lengths(self) -> list[int]:
        """Transitions staged per env for episodes not yet ended."""
        return self.writer.in_progress_lengths()

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
        try:
            slots, weight = self.sampler.sample(self.storage, int(batch_size), self.rng)
        except ValueError:
            if self.storage.n_transitions == 0:
                raise ValueError(f"cannot sample: the storage holds no complete episode yet "
                                 f"({sum(self.writer.in_progress_lengths())} steps of unfinished episodes are not "
                                 "sampleable)") from None
            raise
        return self._build(slots, weight)

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
        return self._build(slots, filled(len(slots), 1.0, "float32"))

    def update_priorities(self, index: np.ndarray, td_error: np.ndarray) -> None:
        """Pass the TD errors of a trained batch to the prioritized sampler.

        Args:
            index: int [B] the batch's ``index``.
            td_error: float [B] or [B, 1] its TD errors (sign ignored).
        Raises:
            ValueError: the sampler is not prioritized (the priorities would be ignored: call this only when
                [`prioritized`][her.buffer.HerReplayBuffer.prioritized]), or bad arguments (see
                ``PrioritizedSampler.update_priorities``).
            IndexError: a slot outside the storage.
        """
        if not self.prioritized:
            how = "samples uniformly" if isinstance(self.sampler, UniformSampler) else "takes no TD errors"
            raise ValueError(f"update_priorities: this buffer {how} ({type(self.sampler).__name__}), so "
                             "priorities would be ignored; pass sampler=her.PrioritizedSampler() for "
                             "prioritized replay, or skip the call when not buffer.prioritized")
        self.sampler.update_priorities(index, td_error)

    def _build(self, slots: np.ndarray, weight: np.ndarray) -> Batch:
        # Bound by numpy call overhead and cache misses: one record gather per state, few numpy calls.
        st = self.storage
        rec = st.gather(slots)
        if self.relabeler is not None:
            goals, relabeled = self.relabeler.relabel(st, slots, rec, self.rng)
        else:
            goals, relabeled = None, np.zeros(len(slots), bool)
        if self.compute_terminated is None:  # keeps custom returns without the keyword working
            ret = self.returns.build(st, slots, rec, goals, self.compute_reward)
        else:
            # an optional keyword of Returns.build: checked with _takes_keyword at construction
            ret = self.returns.build(st, slots, rec, goals, self.compute_reward,
                                     compute_terminated=self.compute_terminated)
        if goals is not None:  # stored rewards are checked when stored; recomputed ones here
            _refuse_non_finite(ret.reward, slots)
        # Fields are strided views of the freshly gathered records (no copies; torch.from_numpy accepts them).
        return Batch(
            observation=rec["observation"],
            desired_goal=goals,
            action=rec["action"],
            reward=ret.reward if ret.reward.dtype == np.float32 else ret.reward.astype(np.float32),
            next_observation=st.gather(ret.next_slots)["observation"],
            discount=ret.discount,
            terminated=ret.terminated,
            weight=weight,
            index=slots,
            relabeled=relabeled,
            n_steps=ret.n_steps,
        )

    # -- persistence
    def state_dict(self) -> dict[str, Any]:
        """Storage, sampler priorities and the RNG state (not the writer's unfinished episodes)."""
        return {"storage": self.storage.state_dict(), "sampler": self.sampler.state_dict(),
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from ``state_dict()``; the writer's unfinished staged episodes are dropped (the envs restart).

        Raises:
            ValueError: a state of a storage of another size or layout; a mapping without the keys
                ``storage``, ``sampler`` and ``rng`` of ``state_dict()``.
            TypeError: ``state`` is not a mapping.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be the mapping HerReplayBuffer.state_dict() returns, got "
                            f"{type(state).__name__}")
        missing = [k for k in ("storage", "sampler", "rng") if k not in state]
        if missing:
            raise ValueError(f"state lacks the keys {missing} of HerReplayBuffer.state_dict() (got keys "
                             f"{sorted(map(str, state))}); a storage's own state goes to storage.load_state_dict")
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])
        self.rng.bit_generator.state = state["rng"]
        self.writer.discard_in_progress()


def _given(**shorthands: Any) -> dict[str, Any]:
    """The shorthand arguments given (not None)."""
    return {k: v for k, v in shorthands.items() if v is not None}


def _piece(piece: Any, name: str, method: str, factory: Callable[..., Any], given: dict[str, Any]) -> Any:
    """``piece``, or ``factory(**given)`` when it is None; refuses both, and a piece without its method."""
    if piece is None:
        return factory(**given)
    if given:
        raise ValueError(f"pass {name}= or its shorthand {', '.join(sorted(given))}, not both")
    if not callable(getattr(piece, method.split("(")[0], None)):
        raise TypeError(f"{name} must have a {method} method, got {piece!r}")
    return piece


def _attached_sampler(storage: EpisodeStorage, sampler: Sampler | None) -> Sampler:
    """``sampler`` (default ``UniformSampler()``) attached to ``storage`` where it has an ``attach``."""
    sampler = _piece(sampler, "sampler", "sample(storage, batch_size, rng)", UniformSampler, {})
    attach = getattr(sampler, "attach", None)  # optional for samplers of your own
    if attach is not None:
        attach(storage)
    return sampler


def _relabeler(storage: EpisodeStorage, relabeler: Relabeler | None, given: dict[str, Any]) -> Relabeler | None:
    """The relabeler of a goal storage; None for a goal-free one, which refuses a relabeler and any relabel
    shorthand but ``n_sampled_goal=0`` (HER would silently be off)."""
    if storage.has_goals:
        return _piece(relabeler, "relabeler", "relabel(storage, slots, records, rng)", make_relabeler, given)
    if relabeler is not None:
        raise ValueError("a relabeler needs a goal storage (this one was built without goal_shape)")
    make_relabeler(**given)  # the values are checked all the same
    if given and given.get("n_sampled_goal") != 0:
        raise ValueError(f"{', '.join(sorted(given))} relabel goals, but this storage was built without goal_shape "
                         "(a goal-free storage samples its transitions as stored)")
    return None

"""Between TensorDicts and ``her``'s numpy arrays, for ``HerTorchRLReplayBuffer``: where each field sits in a
TensorDict (``TensorDictLayout``: the configurable keys), the steps read from a collector's TensorDict, and the
TensorDicts built for ``sample`` and ``rb[index]``. The keys and shapes are those of ``her/torchrl.py``'s module
docstring. Imports torch and tensordict: reached through ``her.torchrl``, which says how to install them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .buffer import Batch
from .storage import EpisodeStorage
from .torchrl_staging import STATE_KEYS

__all__ = ["NestedKey", "TensorDictLayout", "as_key", "to_numpy"]

NestedKey = str | tuple[str, ...]

_new_td = getattr(TensorDict, "_new_unsafe", None) or TensorDict  # skips the per-entry checks (16 us vs 70 us)


def as_key(key: NestedKey) -> tuple[str, ...]:
    """A TensorDict key as a tuple (``"a"`` -> ``("a",)``)."""
    return (key,) if isinstance(key, str) else tuple(key)


def to_numpy(x: Any) -> np.ndarray:
    """``x`` (a tensor, an array, a number) as a numpy array; a CPU tensor without grad is viewed, not copied."""
    if isinstance(x, torch.Tensor):
        try:
            return x.numpy()  # a CPU tensor without grad: no copy, one call
        except (RuntimeError, TypeError):
            return x.detach().cpu().numpy()
    return np.asarray(x)


class TensorDictLayout:
    """Where the fields of a step sit in a TensorDict: ``keys`` (at the root and, for the three state fields,
    under ``"next"``), ``next_keys`` (``reward``, ``done``, ``terminated``, ``truncated`` under ``"next"``) and
    ``info_keys`` (``{name: key}`` of per-step info arrays). Arguments as ``HerTorchRLReplayBuffer``'s ``*_key``
    and ``info_keys``.
    """

    def __init__(self, observation_key: NestedKey, achieved_goal_key: NestedKey, desired_goal_key: NestedKey,
                 action_key: NestedKey, reward_key: NestedKey, done_key: NestedKey, terminated_key: NestedKey,
                 truncated_key: NestedKey, info_keys: Mapping[str, NestedKey] | None) -> None:
        self.keys = {"observation": as_key(observation_key), "achieved_goal": as_key(achieved_goal_key),
                     "desired_goal": as_key(desired_goal_key), "action": as_key(action_key)}
        self.next_keys = {"reward": ("next", *as_key(reward_key)), "done": ("next", *as_key(done_key)),
                          "terminated": ("next", *as_key(terminated_key)),
                          "truncated": ("next", *as_key(truncated_key))}
        self.info_keys = {str(k): as_key(v) for k, v in (info_keys or {}).items()}

    def read(self, data: TensorDictBase, one_step: bool) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Arrays [n, T, ...] of the stored fields, terminated and truncated [n, T] (``one_step``: T = 1, the
        batch dimensions are all env dimensions).

        Raises:
            KeyError: a key is missing (the message names the keys expected), or neither done nor terminated.
            ValueError: a ``[T]`` TensorDict that switches collector trajectory without an episode end (the
                ``reshape(-1)`` of several envs' steps).
        """
        if one_step:
            n, T = math.prod(data.batch_size), 1
        else:
            *env_dims, T = data.batch_size
            n = math.prod(env_dims)

        def get(key: tuple[str, ...]) -> np.ndarray | None:
            x = data.get(key, None)
            if x is None:
                return None
            a = to_numpy(x)
            return a.reshape(n, T, *a.shape[data.ndim:])

        def need(key: tuple[str, ...]) -> np.ndarray:
            a = get(key)
            if a is None:
                expected = [*self.keys.values(), *(("next", *self.keys[k]) for k in STATE_KEYS),
                            self.next_keys["reward"], self.next_keys["done"] + ("or terminated",)]
                raise KeyError(f"HerTorchRLReplayBuffer: the TensorDict has no {key!r} entry (expected "
                               f"{expected}; rename with the *_key arguments). Its keys: "
                               f"{sorted(map(str, data.keys(True, True)))}")
            return a

        arrays = {name: need(key) for name, key in self.keys.items()}
        for name in STATE_KEYS:
            arrays["next_" + name] = need(("next", *self.keys[name]))
        reward = need(self.next_keys["reward"])
        arrays["reward"] = reward.reshape(n, T) if reward.size == n * T else reward
        for name, key in self.info_keys.items():
            arrays["info." + name] = need(key)
        done, term, trunc = (get(self.next_keys[k]) for k in ("done", "terminated", "truncated"))
        if done is None and term is None:
            raise KeyError(f"HerTorchRLReplayBuffer: the TensorDict has neither {self.next_keys['done']!r} nor "
                           f"{self.next_keys['terminated']!r}: episode ends are needed")
        done, term, trunc = (None if a is None else a.reshape(n, T).astype(bool) for a in (done, term, trunc))
        if term is None:
            assert done is not None  # one of done and terminated: checked above
            term = done & ~trunc if trunc is not None else done
        if trunc is None:
            trunc = (done & ~term) if done is not None else np.zeros_like(term)
        if n == 1 and T > 1:
            traj = data.get(("collector", "traj_ids"), None)
            if traj is not None:
                traj = to_numpy(traj).reshape(T)
                changes = np.flatnonzero(traj[1:] != traj[:-1])
                if len(changes) and not (term | trunc)[0, changes].all():
                    raise ValueError(
                        "HerTorchRLReplayBuffer.extend: this [T] TensorDict switches trajectory (collector "
                        "traj_ids) without an episode end: it looks like the reshape(-1) of a batched "
                        "collector's [n_envs, T] output. Pass that output as it is (time last).")
        return arrays, term, trunc


    def sampled(self, b: Batch, st: EpisodeStorage, device: torch.device) -> TensorDict:
        """The TensorDict [B] of ``HerTorchRLReplayBuffer.sample`` from ``her``'s batch ``b`` of storage ``st``."""
        B = len(b.index)
        idx, m = b.index, b.n_steps
        nxt = idx + m
        if st.wraps:
            nxt %= st.n_slots
        term = b.terminated
        ends = ~st.sampleable.take(nxt)  # s_{t+m} (in a live episode) starts no transition: its episode's last state
        flags = np.zeros((4, B, 1), np.bool_)  # ("next", done | terminated | truncated), root (all False)
        flags[0, :, 0] = ends | term
        flags[1, :, 0] = term
        flags[2, :, 0] = ends & ~term
        t = torch.from_numpy
        k, nk = self.keys, self.next_keys
        goal = t(b.desired_goal)
        flat = {
            k["observation"]: t(b.observation), k["achieved_goal"]: t(st.achieved_goal.take(idx, axis=0)),
            k["desired_goal"]: goal, k["action"]: t(b.action),
            ("next", *k["observation"]): t(b.next_observation),
            ("next", *k["achieved_goal"]): t(st.achieved_goal.take(nxt, axis=0)),
            ("next", *k["desired_goal"]): goal, nk["reward"]: t(b.reward.reshape(B, 1)),
            nk["done"]: t(flags[0]), nk["terminated"]: t(flags[1]), nk["truncated"]: t(flags[2]),
            nk["done"][1:]: t(flags[3]), nk["terminated"][1:]: t(flags[3].copy()),
            nk["truncated"][1:]: t(flags[3].copy()),
            ("steps_to_next_obs",): t(m.reshape(B, 1)), ("gamma",): t(b.discount.reshape(B, 1)),
            ("priority_weight",): t(b.weight), ("index",): t(idx), ("relabeled",): t(b.relabeled),
        }
        if device.type != "cpu":
            flat = {key: v.to(device, non_blocking=True) for key, v in flat.items()}
        return _nested_td(_nested(flat), torch.Size([B]), device)

    def stored(self, st: EpisodeStorage, slots: np.ndarray, device: torch.device) -> TensorDict:
        """The TensorDict [B] of ``rb[index]``: the transitions at storage ``slots`` (int [B]) as stored."""
        nxt = (slots + 1) % st.n_slots
        B = len(slots)
        rec = st.gather(slots)
        term = rec["terminated"].astype(np.bool_)
        done = rec["step"] == rec["length"] - 1
        t = torch.from_numpy
        k, nk = self.keys, self.next_keys
        goal = t(np.ascontiguousarray(rec["desired_goal"]))
        falses = np.zeros((B, 1), np.bool_)
        flat = {
            k["observation"]: t(np.ascontiguousarray(rec["observation"])),
            k["achieved_goal"]: t(st.achieved_goal.take(slots, axis=0)), k["desired_goal"]: goal,
            k["action"]: t(np.ascontiguousarray(rec["action"])),
            ("next", *k["observation"]): t(st.observation.take(nxt, axis=0)),
            ("next", *k["achieved_goal"]): t(st.achieved_goal.take(nxt, axis=0)),
            ("next", *k["desired_goal"]): goal.clone(), nk["reward"]: t(rec["reward"].reshape(B, 1).copy()),
            nk["done"]: t(done.reshape(B, 1)), nk["terminated"]: t(term.reshape(B, 1)),
            nk["truncated"]: t((done & ~term).reshape(B, 1)),
            nk["done"][1:]: t(falses), nk["terminated"][1:]: t(falses.copy()), nk["truncated"][1:]: t(falses.copy()),
            ("index",): t(slots.astype(np.int64)),
        }
        flat.update({key: t(np.ascontiguousarray(rec["info." + name])) for name, key in self.info_keys.items()
                     if ("info." + name) in (rec.dtype.names or ())})
        if device.type != "cpu":
            flat = {key: v.to(device) for key, v in flat.items()}
        return _nested_td(_nested(flat), torch.Size([B]), device)


def _nested(flat: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        d = out
        for part in key[:-1]:
            d = d.setdefault(part, {})
        d[key[-1]] = value
    return out


def _nested_td(source: dict[str, Any], batch_size: torch.Size, device: torch.device) -> TensorDict:
    return _new_td({k: _nested_td(v, batch_size, device) if isinstance(v, dict) else v for k, v in source.items()},
                   batch_size=batch_size, device=device)

"""How ``torchrl.data.HERReplayBuffer`` (torchrl 0.14.1) differs from ``her`` through ``her.torchrl``: one small
script per difference, on tag episodes whose achieved goal at step ``t`` of episode ``e`` is ``(t, e)``.

    python tests/benchmarks/torchrl_her_semantics.py      # prints what each function finds

``tests/test_torchrl.py`` asserts what ``docs/torchrl.md`` quotes from these functions.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch
from tensordict import TensorDict

from her.torchrl import HerTorchRLReplayBuffer

T = 10  # transitions per tag episode


def tag_episode(e: int = 0, reward: float = 0.0) -> TensorDict:
    """One episode of T transitions, [T]; state t has observation = achieved goal = (t, e); goal (-1, -1)."""
    t = torch.arange(T, dtype=torch.float32)
    ep = torch.full((T,), float(e))
    ag, nag = torch.stack([t, ep], -1), torch.stack([t + 1, ep], -1)
    goal = torch.full((T, 2), -1.0)
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[-1] = True
    return TensorDict({
        "observation": ag.clone(), "achieved_goal": ag, "desired_goal": goal, "action": torch.zeros(T, 1),
        "next": {"observation": nag.clone(), "achieved_goal": nag, "desired_goal": goal.clone(),
                 "reward": torch.full((T, 1), reward), "done": done, "terminated": torch.zeros_like(done),
                 "truncated": done.clone()},
    }, batch_size=[T])


def reward_np(achieved_goal, desired_goal, info=None):
    return -(np.abs(achieved_goal - desired_goal).sum(-1) > 0.01).astype(np.float32)


def reward_td(td):
    """TorchRL's reward_fn convention: a TensorDict with the relabeled goal in; [B, 1] out."""
    hit = (td["next", "achieved_goal"] - td["desired_goal"]).abs().sum(-1, keepdim=True) <= 0.01
    return -(~hit).float()


def torchrl_buffer(capacity: int, strategy: str = "future", her_ratio: float = 1.0, batch_size: int = 4000):
    from torchrl.data import HERReplayBuffer, LazyTensorStorage

    logging.getLogger("torchrl").setLevel(logging.WARNING)  # not an INFO line per storage
    return HERReplayBuffer(reward_td, her_ratio=her_ratio, strategy=strategy, storage=LazyTensorStorage(capacity),
                           batch_size=batch_size)


def ours(capacity: int, strategy: str = "future", **kw) -> HerTorchRLReplayBuffer:
    return HerTorchRLReplayBuffer(capacity, reward_np, strategy=strategy, max_episode_steps=T, batch_size=4000,
                                  seed=0, **kw)


def _goal_offsets(s: TensorDict) -> list[int]:
    rel = s["desired_goal"][:, 0] >= 0  # relabeled rows (the real goal is (-1, -1))
    return sorted(set((s["desired_goal"][rel, 0] - s["achieved_goal"][rel, 0]).long().tolist()))


def future_goals() -> dict:
    """``future``: which steps ``t' - t`` the relabeled goals of transition ``t`` come from (HER: t+1..T)."""
    trl, our = torchrl_buffer(1000), ours(1000)
    trl.extend(tag_episode())
    our.extend(tag_episode())
    return {"torchrl_offsets": _goal_offsets(trl.sample()), "ours_offsets": _goal_offsets(our.sample())}


def final_goal() -> dict:
    """``final``: the state whose achieved goal is used (HER: the last state, s_T = step 10)."""
    trl, our = torchrl_buffer(1000, "final"), ours(1000, "final", n_sampled_goal=10**6)
    trl.extend(tag_episode())
    our.extend(tag_episode())
    steps = lambda s: sorted(set(s["desired_goal"][s["desired_goal"][:, 0] >= 0, 0].long().tolist()))
    return {"torchrl_goal_steps": steps(trl.sample()), "ours_goal_steps": steps(our.sample())}


def extend_into_full_buffer() -> dict:
    """Capacity 100 = 10 episodes; extend an 11th, then sample."""
    out = {}
    for name, buf in (("torchrl", torchrl_buffer(100, batch_size=32)), ("ours", ours(100))):
        try:
            for e in range(11):
                buf.extend(tag_episode(e))
                buf.sample(32)
            out[name + "_error"] = None
        except Exception as exc:  # the error is the finding
            out[name + "_error"] = f"{type(exc).__name__}: {exc}"
    return out


def episode_across_the_ring_end() -> dict:
    """Capacity 25, three episodes of 10: the third runs past the end of the ring. Share of its relabeled
    transitions t <= 3 whose goal is their own state's achieved goal (HER future: never), and rows sampled from a
    partly overwritten episode ("orphans": steps 5..9 of episode 0 without their start)."""
    out = {}
    for name, buf in (("torchrl", torchrl_buffer(25)), ("ours", ours(25))):
        for e in range(3):
            buf.extend(tag_episode(e))
        s = buf.sample(4000)
        ep, t, g = s["achieved_goal"][:, 1], s["achieved_goal"][:, 0], s["desired_goal"][:, 0]
        rows = (ep == 2) & (t <= 3) & (g >= 0)
        out[name + "_goal_is_own_state"] = float((g[rows] == t[rows]).float().mean())
        out[name + "_orphan_rows"] = int((ep == 0).sum())
    return out


def n_step_with_relabeling() -> dict:
    """3-step returns, gamma 0.5: TorchRL's ``MultiStepTransform`` on its buffer vs our ``n_step=3``. Max error of
    the relabeled rows' reward against the 3-step return ``sum_{j<m} 0.5^j r(ag_{t+j+1}, g')`` for their goal."""
    from torchrl.envs.transforms import MultiStepTransform

    def error(s: TensorDict) -> tuple[float, list[float], list[int]]:
        rel = s["desired_goal"][:, 0] >= 0
        t, g = s["achieved_goal"][rel, 0], s["desired_goal"][rel, 0]
        m = torch.clamp(T - t, max=3)
        want = sum(torch.where(j < m, 0.5**j * -((t + j + 1) != g).float(), 0.0) for j in range(3))
        got = s["next", "reward"][rel, 0]
        return (float((got - want).abs().max()), sorted(set(got.tolist())),
                sorted(set(s["steps_to_next_obs"][rel].reshape(-1).tolist())))

    trl = torchrl_buffer(1000, her_ratio=0.5, batch_size=2000)
    trl.append_transform(MultiStepTransform(n_steps=3, gamma=0.5))
    trl.extend(tag_episode(reward=-1.0))
    our = ours(1000, n_step=3, gamma=0.5)
    our.extend(tag_episode(reward=-1.0))
    t_err, t_rewards, t_steps = error(trl.sample())
    o_err, _, _ = error(our.sample())
    return {"torchrl_relabeled_max_abs_error": t_err, "torchrl_relabeled_rewards": t_rewards,
            "torchrl_steps_to_next_obs": t_steps, "ours_relabeled_max_abs_error": o_err}


def prioritized_sampler() -> dict:
    """TorchRL's prioritized sampler needs its C++ extension; with torch 2.13.0 it does not load."""
    from torchrl.data import PrioritizedSampler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            PrioritizedSampler(100, alpha=0.6, beta=0.4)
        except Exception as exc:  # the error is the finding
            return {"torchrl_error": f"{type(exc).__name__}: {exc}"}
    return {"torchrl_error": None}


def main() -> None:
    import torchrl

    print(f"torch {torch.__version__}, torchrl {torchrl.__version__}")
    for fn in (future_goals, final_goal, extend_into_full_buffer, episode_across_the_ring_end,
               n_step_with_relabeling, prioritized_sampler):
        print(f"{fn.__name__}: {fn()}")


if __name__ == "__main__":
    main()

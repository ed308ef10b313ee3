"""Prioritized Replay double DQN on CartPole-v1 with the ``her`` replay library (no goals, no relabeling).

The Prioritized Replay DDQN of Schaul et al. (2016), as in the seed write-up, but with ``her``'s pieces instead
of a hand-written SumTree: a goal-free ``EpisodeStorage`` (whole episodes, terminated vs. time-limit kept
apart), a ``PrioritizedSampler`` (proportional priorities ``(min(|delta|, clip) + eps) ** alpha``, stratified
draws, importance-sampling weights ``(p_i / p_min) ** -beta`` with beta annealed to 1) and ``HerReplayBuffer``
to build the batches. Per update:

1. ``batch = buffer.sample(B)``: slots drawn by priority, IS weights ``batch.weight``;
2. double-DQN target ``y = r + gamma (1 - terminated) Q'(s', argmax_a Q(s', a))``;
3. loss ``mean(w * huber(y - Q(s, a)))``: the IS weights correct the non-uniform draws;
4. ``buffer.update_priorities(batch.index, y - Q(s, a))``: the new TD errors go back into the sum tree.

Run::

    python examples/cartpole_per_ddqn.py --steps 30000
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import her


def q_network(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def evaluate(q: nn.Module, episodes: int, seed: int) -> float:
    """Mean undiscounted return of the greedy policy over ``episodes`` CartPole-v1 episodes (max 500)."""
    env = gym.make("CartPole-v1")
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                a = int(q(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax(1))
            obs, r, terminated, truncated, _ = env.step(a)
            total += float(r)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def main(total_steps: int = 30_000, learning_starts: int = 1_000, batch_size: int = 64, hidden: int = 128,
         lr: float = 1e-3, gamma: float = 0.99, target_update_every: int = 500, eps_start: float = 1.0,
         eps_end: float = 0.02, eps_decay_steps: int = 10_000, alpha: float = 0.6, beta0: float = 0.4,
         td_error_clip: float | None = 1.0, capacity: int = 50_000, eval_every: int = 2_500,
         eval_episodes: int = 5, stop_at_return: float | None = None, seed: int = 0, verbose: bool = True) -> dict:
    """Train and return ``{"evals": [(env steps, mean return)], "last_return", "best_return", ...}``.

    ``stop_at_return``: stop at the first evaluation whose mean return reaches it (keeps tests short).
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env = gym.make("CartPole-v1")
    storage = her.storage_from_env(env, capacity)  # goal-free: observation (4,), discrete action ()
    n_updates = total_steps - learning_starts
    sampler = her.PrioritizedSampler(alpha=alpha, beta0=beta0, beta_annealing_steps=n_updates,
                                     td_error_clip=td_error_clip)
    buffer = her.HerReplayBuffer(storage, sampler=sampler, n_step=1, gamma=gamma, seed=seed)
    q, q_target = q_network(hidden), q_network(hidden)
    q_target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    obs, _ = env.reset(seed=seed)
    evals: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    for step in range(1, total_steps + 1):
        eps = max(eps_end, eps_start - (eps_start - eps_end) * step / eps_decay_steps)
        if rng.random() < eps:
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax(1))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # One env: rows of 1. ``next_obs`` is the real last state even at an episode end (reset comes after).
        buffer.add(obs[None], np.array([action], np.float32), np.array([reward], np.float32), next_obs[None],
                   np.array([terminated]), np.array([truncated]))
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()

        if step >= learning_starts and len(storage) >= batch_size:
            batch = buffer.sample(batch_size)
            b = batch.to_torch()
            a = b["action"].long().unsqueeze(1)
            with torch.no_grad():
                a_next = q(b["next_observation"]).argmax(1, keepdim=True)  # double DQN: online net picks
                q_next = q_target(b["next_observation"]).gather(1, a_next).squeeze(1)  # target net evaluates
                y = b["reward"] + b["discount"] * (~b["terminated"]).float() * q_next
            q_sa = q(b["observation"]).gather(1, a).squeeze(1)
            td = y - q_sa
            loss = (b["weight"] * nn.functional.smooth_l1_loss(q_sa, y, reduction="none")).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0)
            opt.step()
            buffer.update_priorities(batch.index, td.detach().numpy())
            if step % target_update_every == 0:
                q_target.load_state_dict(q.state_dict())

        if step % eval_every == 0 or step == total_steps:
            ret = evaluate(q, eval_episodes, seed=10_000 + step)
            evals.append((step, ret))
            if verbose:
                print(f"step {step:6d}  eval return {ret:6.1f}  eps {eps:.2f}  beta {sampler.beta:.2f}  "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
            if stop_at_return is not None and ret >= stop_at_return:
                break
    env.close()
    return {"evals": evals, "last_return": evals[-1][1], "best_return": max(r for _, r in evals),
            "steps": step, "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    main(total_steps=a.steps, seed=a.seed)

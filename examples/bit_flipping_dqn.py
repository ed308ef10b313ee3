"""DQN + HER on the bit-flipping task of the HER paper (Andrychowicz et al. 2017, Sec. 3.1 and 4.1).

The state is ``n`` bits, the goal another ``n`` bits, an action flips one bit, the reward is ``-1`` until the
state equals the goal (``0`` then, and the episode ends); episodes last at most ``n`` steps. From a random
start the chance of hitting a random 15-bit goal by exploring is ~0, so plain DQN (``n_sampled_goal=0``) never
sees a reward other than -1; HER relabels goals with states the agent did reach and solves it.

Only the ``her`` storage and buffer (numpy) plus a few lines of plain torch::

    python examples/bit_flipping_dqn.py --bits 15 --epochs 12            # HER, future, k=4
    python examples/bit_flipping_dqn.py --bits 15 --epochs 12 --k 0      # no HER: stays at 0

Termination and relabeling: the env ends an episode when the state reaches *its* goal. For a relabeled goal
the stored ``terminated`` flag (about the original goal) does not apply, so the TD target treats a transition
as terminal when its recomputed reward says the next state achieves the goal it is trained with
(``reward == 0``), whatever the goal; with ``n_step=1`` this is exact.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

import her


class BitFlippingEnvs:
    """``n_envs`` bit-flipping goal envs stepped together (numpy, no gymnasium), with autoreset.

    Observations are goal-env dicts ``{"observation", "achieved_goal", "desired_goal"}`` of float32 bits
    [n_envs, n_bits]; the observation is the state itself (it equals the achieved goal).
    """

    def __init__(self, n_bits: int, n_envs: int, seed: int | None = None) -> None:
        self.n_bits, self.n_envs, self.max_steps = n_bits, n_envs, n_bits
        self.rng = np.random.default_rng(seed)
        self.state = np.zeros((n_envs, n_bits), np.float32)
        self.goal = np.zeros((n_envs, n_bits), np.float32)
        self.t = np.zeros(n_envs, np.int64)

    @staticmethod
    def compute_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info=None) -> np.ndarray:
        """Vectorized: 0 where all bits match, else -1; shapes [N, n] -> [N] float32."""
        return -np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1).astype(np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def _reset_envs(self, mask: np.ndarray) -> None:
        k = int(mask.sum())
        self.state[mask] = self.rng.integers(0, 2, (k, self.n_bits))
        goal = self.rng.integers(0, 2, (k, self.n_bits)).astype(np.float32)
        same = np.all(goal == self.state[mask], axis=1)  # never start solved
        goal[same, 0] = 1.0 - goal[same, 0]
        self.goal[mask] = goal
        self.t[mask] = 0

    def reset(self) -> dict[str, np.ndarray]:
        self._reset_envs(np.ones(self.n_envs, bool))
        return self._obs()

    def step(self, action: np.ndarray):
        """Returns (obs, reward, terminated, truncated, final_obs): ``obs`` is already reset for the envs that
        ended; ``final_obs`` is the real next state of every env (what the replay storage needs)."""
        idx = np.arange(self.n_envs)
        self.state[idx, action] = 1.0 - self.state[idx, action]
        self.t += 1
        final_obs = self._obs()
        reward = self.compute_reward(self.state, self.goal)
        terminated = reward == 0
        truncated = ~terminated & (self.t >= self.max_steps)
        done = terminated | truncated
        if done.any():
            self._reset_envs(done)
        return self._obs(), reward, terminated, truncated, final_obs


def q_network(n_bits: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(2 * n_bits, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, n_bits))


def evaluate(q: nn.Module, n_bits: int, episodes: int, seed: int) -> float:
    """Greedy success rate: the fraction of episodes that reach their goal within ``n_bits`` steps."""
    envs = BitFlippingEnvs(n_bits, episodes, seed)
    obs = envs.reset()
    success = np.zeros(episodes, bool)
    active = np.ones(episodes, bool)
    with torch.no_grad():
        for _ in range(n_bits):
            x = torch.from_numpy(np.concatenate([obs["observation"], obs["desired_goal"]], 1))
            action = q(x).argmax(1).numpy()
            obs, _, terminated, truncated, _ = envs.step(action)
            success |= active & terminated
            active &= ~(terminated | truncated)
    return float(success.mean())


def main(n_bits: int = 15, epochs: int = 12, cycles: int = 20, episodes_per_cycle: int = 16,
         updates_per_cycle: int = 40, strategy: str = "future", k: int = 4, batch_size: int = 128,
         hidden: int = 256, lr: float = 1e-3, gamma: float = 0.98, epsilon: float = 0.2, polyak: float = 0.95,
         eval_episodes: int = 100, seed: int = 0, verbose: bool = True) -> dict:
    """Train DQN (+ HER unless ``k == 0``) and return ``{"success": [per epoch], "final_success", ...}``.

    One epoch = ``cycles`` x (``episodes_per_cycle`` episodes from parallel envs, then ``updates_per_cycle``
    DQN updates); the greedy policy is evaluated after each epoch (the HER paper's epoch/cycle structure).
    """
    torch.manual_seed(seed)
    envs = BitFlippingEnvs(n_bits, episodes_per_cycle, seed)
    storage = her.EpisodeStorage(
        capacity=1_000_000 // 10, observation_shape=(n_bits,), action_shape=(), goal_shape=(n_bits,),
        max_episode_steps=n_bits, n_envs=episodes_per_cycle,
    )
    buffer = her.HerReplayBuffer(storage, BitFlippingEnvs.compute_reward, strategy=strategy, n_sampled_goal=k,
                                 n_step=1, gamma=gamma, seed=seed)
    q, q_target = q_network(n_bits, hidden), q_network(n_bits, hidden)
    q_target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    rng = np.random.default_rng(seed + 1)
    history, t0 = [], time.perf_counter()
    q_lo = -1.0 / (1.0 - gamma)
    for epoch in range(epochs):
        for _ in range(cycles):
            # Collect one episode per env (they end together or earlier on success; run until all ended once).
            obs = envs.reset()
            ended = np.zeros(envs.n_envs, bool)
            while not ended.all():
                with torch.no_grad():
                    x = torch.from_numpy(np.concatenate([obs["observation"], obs["desired_goal"]], 1))
                    action = q(x).argmax(1).numpy()
                explore = rng.random(envs.n_envs) < epsilon
                action[explore] = rng.integers(0, n_bits, int(explore.sum()))
                next_obs, reward, terminated, truncated, final_obs = envs.step(action)
                buffer.add(obs, action.astype(np.float32), reward, final_obs, terminated, truncated)
                ended |= terminated | truncated
                obs = next_obs
            buffer.discard_in_progress()  # the envs that restarted early: drop their partial episodes
            for _ in range(updates_per_cycle):
                b = buffer.sample(batch_size).to_torch()
                x = torch.cat([b["observation"], b["desired_goal"]], 1)
                nx = torch.cat([b["next_observation"], b["desired_goal"]], 1)
                # Reaching the (possibly relabeled) goal ends the episode: terminal for the target.
                done = (b["terminated"] | (b["reward"] == 0)).float()
                with torch.no_grad():
                    a_next = q(nx).argmax(1, keepdim=True)  # double DQN
                    target = b["reward"] + b["discount"] * (1 - done) * q_target(nx).gather(1, a_next).squeeze(1)
                    target = target.clamp(q_lo, 0.0)
                q_sa = q(x).gather(1, b["action"].long().unsqueeze(1)).squeeze(1)
                loss = (b["weight"] * (q_sa - target) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            with torch.no_grad():
                for p, pt in zip(q.parameters(), q_target.parameters()):
                    pt.mul_(polyak).add_((1 - polyak) * p)
        success = evaluate(q, n_bits, eval_episodes, seed=10_000 + epoch)
        history.append(success)
        if verbose:
            print(f"epoch {epoch + 1:3d}  success {success:.2f}  episodes {storage.n_episodes_added}  "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)
    return {"success": history, "final_success": history[-1], "episodes": storage.n_episodes_added,
            "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bits", type=int, default=15)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--strategy", default="future", choices=list(her.RelabelStrategy))
    p.add_argument("--k", type=int, default=4, help="n_sampled_goal; 0 = no HER")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    main(n_bits=a.bits, epochs=a.epochs, strategy=a.strategy, k=a.k, seed=a.seed)

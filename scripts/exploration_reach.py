"""How often exploration alone reaches the block on FetchPush-v4, with an actor that outputs 0.

For each exploration scheme, runs episodes of the env with only the exploration's actions and counts the
episodes in which the gripper came within 5 cm of the block at some step and those that ended with the block
moved by more than 2 cm. This is what the critic can learn its first pushes from before the actor knows
anything (docs/experiments/push.md, "Why TD3 and DDPG lagged SAC").

    python scripts/exploration_reach.py --episodes 200 recipe noise05 sac ou per_episode
"""

from __future__ import annotations

import argparse

import numpy as np

REACH_M = 0.05  # gripper-to-block distance counted as reaching the block
MOVED_M = 0.02  # block displacement counted as moving it
EPISODE_SCALES = (0.1, 0.3, 1.0)  # per_episode: one Gaussian std per episode, drawn from these


class Exploration:
    """Actions in ``[-1, 1]`` (float64 ``[action_dim]``) for an actor whose output is 0.

    Schemes: ``recipe`` N(0, 0.2) with 30% uniform random actions (the DDPG/TD3 configs' ``noise_std`` and
    ``random_eps``); ``noise05`` the same with std 0.5; ``sac`` tanh(N(0, 1)), SAC's starting policy;
    ``ou`` Ornstein-Uhlenbeck noise (theta 0.15, sigma 0.3; Lillicrap et al. 2016, DDPG, Sec. 7);
    ``per_episode`` N(0, s) with one s per episode from ``EPISODE_SCALES``.

    Raises:
        ValueError: an unknown scheme.
    """

    SCHEMES = ("recipe", "noise05", "sac", "ou", "per_episode")

    def __init__(self, scheme: str, action_dim: int, rng: np.random.Generator) -> None:
        if scheme not in self.SCHEMES:
            raise ValueError(f"scheme must be one of {self.SCHEMES}, got {scheme!r}")
        self.scheme, self.action_dim, self.rng = scheme, action_dim, rng
        self.reset()

    def reset(self) -> None:
        """Start of an episode: the OU state back to 0, a new per-episode scale."""
        self.ou = np.zeros(self.action_dim)
        self.scale = float(self.rng.choice(EPISODE_SCALES))

    def __call__(self) -> np.ndarray:
        rng, d = self.rng, self.action_dim
        if self.scheme in ("recipe", "noise05"):
            a = rng.normal(0.0, 0.2 if self.scheme == "recipe" else 0.5, d)
            if rng.random() < 0.3:
                a = rng.uniform(-1.0, 1.0, d)
        elif self.scheme == "sac":
            a = np.tanh(rng.normal(0.0, 1.0, d))
        elif self.scheme == "ou":
            self.ou += 0.15 * (0.0 - self.ou) + 0.3 * rng.normal(size=d)
            a = self.ou
        else:
            a = rng.normal(0.0, self.scale, d)
        return np.clip(a, -1.0, 1.0)


def run(scheme: str, episodes: int, seed: int = 0) -> tuple[float, float]:
    """``(share of episodes reaching the block, share moving it)`` for ``scheme`` on FetchPush-v4."""
    import gymnasium as gym
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    env = gym.make("FetchPush-v4")
    rng = np.random.default_rng(seed)
    explore = Exploration(scheme, env.action_space.shape[0], rng)
    reached = moved = 0
    for _ in range(episodes):
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        explore.reset()
        start, near, done = obs["achieved_goal"].copy(), False, False
        while not done:
            obs, _, terminated, truncated, _ = env.step(explore())
            near |= bool(np.linalg.norm(obs["observation"][:3] - obs["achieved_goal"]) < REACH_M)
            done = terminated or truncated
        reached += near
        moved += bool(np.linalg.norm(obs["achieved_goal"] - start) > MOVED_M)
    env.close()
    return reached / episodes, moved / episodes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("schemes", nargs="+", choices=Exploration.SCHEMES)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for scheme in args.schemes:
        reached, moved = run(scheme, args.episodes, args.seed)
        print(f"{scheme:12s} reached the block {reached:.2f}, moved it {moved:.2f} ({args.episodes} episodes)")


if __name__ == "__main__":
    main()

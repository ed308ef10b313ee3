"""Fetch object tasks: what a checkpoint's policy does with its actions and the object.

    python scripts/fetch_policy_behaviour.py RUN_DIR/checkpoint.pt [--episodes 50] [--seed 1000]

Plays ``--episodes`` episodes with the deterministic policy and as many with the exploration policy the training
loop uses (``act(deterministic=False)``: Gaussian noise and random actions, ``agent.noise_std`` and
``agent.random_eps``), episode ``i`` reset with ``seed + i``. For each it prints:

- the actions: mean ``|a|`` per dimension (x, y, z, gripper; actions in ``[-1, 1]``) and the share of saturated
  entries (``|a| > 0.95``): a deterministic actor stuck at 0 barely moves, one stuck at +-1 bangs into the limits;
- the gripper: the share of episodes in which the gripper came within 5 cm of the object (``reached``) and the
  median over episodes of the closest it came, in cm;
- the object: the share of episodes in which it moved more than 2 cm (``moved``), and the success rate.

Gripper and object positions are the first six entries of the Fetch observation (metres). This tells a policy
that never reaches the object (an exploration problem) from one that reaches it and pushes the wrong way.
"""

from __future__ import annotations

import numpy as np

from her_agents.tools import checkpoint_analysis
from her_envs import make_env

REACH_M = 0.05  # the gripper "reached" the object within this distance (the object is a 5 cm cube)
MOVED_M = 0.02


def episode_stats(actions: np.ndarray, grip: np.ndarray, obj: np.ndarray, success: bool) -> dict[str, float]:
    """One episode's summary. ``actions`` ``[T, 4]`` in ``[-1, 1]``; ``grip`` and ``obj`` ``[T + 1, 3]``
    positions in metres (the reset's and every step's); ``success``: the env's last ``is_success``."""
    closest = float(np.min(np.linalg.norm(grip - obj, axis=1)))
    return {
        "abs_action": np.abs(actions).mean(0),
        "saturated": float(np.mean(np.abs(actions) > 0.95)),
        "closest": closest,
        "reached": float(closest < REACH_M),
        "moved": float(np.linalg.norm(obj[-1] - obj[0]) > MOVED_M),
        "success": float(success),
    }


def summary(stats: list[dict[str, float]]) -> str:
    """The line printed for a list of :func:`episode_stats`."""
    abs_a = np.mean([s["abs_action"] for s in stats], axis=0)
    return (f"mean |a| (x, y, z, grip) {', '.join(f'{v:.2f}' for v in abs_a)}; "
            f"saturated {np.mean([s['saturated'] for s in stats]):.2f}; "
            f"reached {np.mean([s['reached'] for s in stats]):.2f} "
            f"(closest median {np.median([s['closest'] for s in stats]) * 100:.1f} cm); "
            f"moved {np.mean([s['moved'] for s in stats]):.2f}; "
            f"success {np.mean([s['success'] for s in stats]):.2f}")


def main() -> None:
    args, state, agent = checkpoint_analysis(__doc__, "Fetch", episodes=50)
    env_id = state["config"]["env"]["id"]
    if env_id.startswith("FetchReach"):
        raise SystemExit(f"fetch_policy_behaviour.py: {env_id} has no object; use a Push, Slide or "
                         "PickAndPlace run")
    env = make_env(env_id)
    print(f"{env_id} {state['config']['algo']} @ {state['counters']['env_steps']} env steps, "
          f"{args.episodes} episodes each")
    for deterministic in (True, False):
        stats = []
        for i in range(args.episodes):
            obs, _ = env.reset(seed=args.seed + i)
            actions, grip, obj = [], [obs["observation"][:3].copy()], [obs["observation"][3:6].copy()]
            terminated = truncated = False
            while not (terminated or truncated):
                action = agent.act(obs["observation"][None], obs["desired_goal"][None],
                                   deterministic=deterministic)[0]
                obs, _, terminated, truncated, info = env.step(action)
                actions.append(action)
                grip.append(obs["observation"][:3].copy())
                obj.append(obs["observation"][3:6].copy())
            stats.append(episode_stats(np.array(actions), np.array(grip), np.array(obj), bool(info["is_success"])))
        print(f"  {'deterministic' if deterministic else 'exploration  '}: {summary(stats)}")
    env.close()


if __name__ == "__main__":
    main()

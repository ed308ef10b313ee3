"""FetchPickAndPlace: eval success of a checkpoint split by where the goal is (on the table or in the air).

    python scripts/pnp_success_by_goal_height.py RUN_DIR/checkpoint.pt [--episodes 100] [--seed 1000]

Deterministic policy, plain env resets (no grasped start), episode ``i`` reset with ``seed + i``. A goal counts as
"in the air" when it is more than 1 cm above the box's start height; the env puts half of its goals there. Prints
the success rate of each group and the share of air-goal episodes in which the box was lifted more than 2 cm,
which tells a policy that pushes (table goals only) from one that picks.
"""

from __future__ import annotations

import numpy as np

from her_agents.tools import checkpoint_analysis
from her_envs import make_env


def main() -> None:
    args, state, agent = checkpoint_analysis(__doc__, "FetchPickAndPlace", episodes=100)
    cfg = state["config"]
    env = make_env(cfg["env"]["id"])
    air, success, lifted = [], [], []
    for i in range(args.episodes):
        obs, _ = env.reset(seed=args.seed + i)
        start_z, goal_z, top = obs["achieved_goal"][2], obs["desired_goal"][2], -np.inf
        truncated = terminated = False
        while not (terminated or truncated):
            action = agent.act(obs["observation"][None], obs["desired_goal"][None], deterministic=True)[0]
            obs, _, terminated, truncated, info = env.step(action)
            top = max(top, obs["achieved_goal"][2])
        air.append(goal_z - start_z > 0.01)
        success.append(bool(info["is_success"]))
        lifted.append(top - start_z > 0.02)
    env.close()
    air, success, lifted = map(np.array, (air, success, lifted))
    def rate(x: np.ndarray) -> str:
        return f"{x.mean():.2f}" if x.size else "-"

    print(f"{cfg['env']['id']} {cfg['algo']} @ {state['counters']['env_steps']} env steps, {args.episodes} episodes: "
          f"success {rate(success)}; table goals {rate(success[~air])} ({(~air).sum()}), "
          f"air goals {rate(success[air])} ({air.sum()}); box lifted > 2 cm in "
          f"{rate(lifted[air])} of the air-goal episodes")


if __name__ == "__main__":
    main()

"""FetchSlide: where a checkpoint's evaluation episodes end, split by how far the goal is and how they fail.

    python scripts/slide_failure_modes.py RUN_DIR/checkpoint.pt [--episodes 200] [--seed 1000]

Deterministic policy, plain env resets, episode ``i`` reset with ``seed + i``. For each episode the puck's final
position is compared with the goal along the line from the puck's start to the goal: ``along`` > 0 is past the
goal (overshoot), < 0 short of it; ``lateral`` is the distance off that line. The env counts a success within
5 cm of the goal. A failed episode is then one of:

- ``untouched``: the puck moved less than 2 cm;
- ``off table``: the puck ended more than 5 cm below its start height;
- ``short`` / ``overshoot``: more than 5 cm short of or past the goal along the line, and more off along it
  than across it;
- ``sideways``: the rest (the strike's direction was off).

Prints the success rate by goal distance (from the puck's start) and the share of each failure kind, which
tells a policy that cannot aim from one that cannot judge the strike's strength.
"""

from __future__ import annotations

import numpy as np

from her_agents.tools import checkpoint_analysis
from her_envs import make_env

DISTANCE_BINS = (0.0, 0.3, 0.45, 0.6, np.inf)  # metres from the puck's start to the goal, in the table plane
FAILURES = ("untouched", "off table", "short", "overshoot", "sideways")


def classify(start: np.ndarray, goal: np.ndarray, final: np.ndarray, success: bool) -> tuple[str, float, float]:
    """The episode's outcome (``"success"`` or one of ``FAILURES``), and its final ``along`` and ``lateral``
    errors in metres (module docstring). ``start``, ``goal``, ``final``: (3,) positions in metres."""
    line = goal[:2] - start[:2]
    line = line / max(np.linalg.norm(line), 1e-9)
    err = final[:2] - goal[:2]
    along = float(err @ line)
    lateral = float(abs(err[0] * line[1] - err[1] * line[0]))
    if success:
        return "success", along, lateral
    if np.linalg.norm(final - start) < 0.02:
        return "untouched", along, lateral
    if final[2] < start[2] - 0.05:
        return "off table", along, lateral
    if abs(along) > 0.05 and abs(along) >= lateral:
        return ("overshoot" if along > 0 else "short"), along, lateral
    return "sideways", along, lateral


def main() -> None:
    args, state, agent = checkpoint_analysis(__doc__, "FetchSlide", episodes=200)
    env_id = state["config"]["env"]["id"]
    env = make_env(env_id)
    distance, outcome, along, lateral = [], [], [], []
    for i in range(args.episodes):
        obs, _ = env.reset(seed=args.seed + i)
        start, goal = obs["achieved_goal"].copy(), obs["desired_goal"].copy()
        terminated = truncated = False
        while not (terminated or truncated):
            action = agent.act(obs["observation"][None], obs["desired_goal"][None], deterministic=True)[0]
            obs, _, terminated, truncated, info = env.step(action)
        kind, a, lat = classify(start, goal, obs["achieved_goal"], bool(info["is_success"]))
        distance.append(float(np.linalg.norm(goal[:2] - start[:2])))
        outcome.append(kind)
        along.append(a)
        lateral.append(lat)
    env.close()
    distance, outcome, along, lateral = map(np.array, (distance, outcome, along, lateral))
    success = outcome == "success"
    print(f"{env_id} {state['config']['algo']} @ {state['counters']['env_steps']} env steps, {args.episodes} "
          f"episodes: success {success.mean():.2f}")
    print("by goal distance from the puck's start:")
    for lo, hi in zip(DISTANCE_BINS[:-1], DISTANCE_BINS[1:]):
        m = (distance >= lo) & (distance < hi)
        if m.any():
            label = f"{lo:.2f}-{hi:.2f} m" if np.isfinite(hi) else f">= {lo:.2f} m"
            kinds = ", ".join(f"{kind} {np.sum(outcome[m] == kind)}" for kind in FAILURES if np.any(outcome[m] == kind))
            print(f"  {label:>12}: success {success[m].mean():.2f} ({m.sum()} episodes)"
                  + (f"; failed: {kinds}" if kinds else ""))
    failed = ~success
    print(f"failures ({failed.sum()}):" + "".join(
        f" {kind} {np.mean(outcome[failed] == kind):.2f}" for kind in FAILURES) if failed.any() else "failures: none")
    if failed.any():
        print(f"  failed episodes' final error: along the line median {np.median(along[failed]) * 100:+.1f} cm, "
              f"off the line median {np.median(lateral[failed]) * 100:.1f} cm")


if __name__ == "__main__":
    main()

"""Time ``agent.act()`` per env step on the CPU: the numpy policy (:class:`her_agents.algos.numpy_actor.NumpyActor`)
against the torch policy (``agent.numpy_acting = False``).

    python tests/benchmarks/bench_act.py [--rows 1 2 16] [--threads 1]

FetchPush sizes (obs 25, goal 3, action 4), 3x256 LayerNorm actor; best of 5 repeats of 500 calls, in microseconds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from her_agents.algos.registry import make_agent

OBS, GOAL, ACT = 25, 3, 4


def time_act(agent, observation: np.ndarray, desired_goal: np.ndarray, calls: int = 500) -> float:
    """Best-of-5 microseconds per ``act()`` call (exploration on) after 200 calls of warm-up."""
    for _ in range(200):
        agent.act(observation, desired_goal)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            agent.act(observation, desired_goal)
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 16], help="envs acting at once")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for algo in ("ddpg", "sac"):
        for n in args.rows:
            agent = make_agent(algo, OBS, GOAL, ACT, device="cpu", layer_norm=True)
            rng = np.random.default_rng(0)
            obs = rng.normal(size=(n, OBS)).astype(np.float32)
            goal = rng.normal(size=(n, GOAL)).astype(np.float32)
            agent.update_normalizer(obs, goal)
            us = {}
            for numpy_acting in (True, False):
                agent.numpy_acting = numpy_acting
                us[numpy_acting] = time_act(agent, obs, goal)
            print(f"{algo} rows {n}: numpy {us[True]:.0f} us, torch {us[False]:.0f} us per act() "
                  f"({us[False] / us[True]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()

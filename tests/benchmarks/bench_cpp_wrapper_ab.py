"""A/B of Inductor's C++ wrapper in one process: the compiled bf16 whole update with Python calling its kernels (A)
against compiled C++ calling them (B, what the agents do on a CPU), timed alternately so that a shared machine's
slow spells hit both alike.

    python tests/benchmarks/bench_cpp_wrapper_ab.py [--algos ddpg td3 sac] [--rounds 6] [--batch-size 256]

Same networks, same maths; one line per algorithm and variant with the first compile's seconds, min and median ms
over the rounds (each the best of 5 repeats of 20 updates) and their ratios to the FLOP floor of
``bench_update.py``, measured in the same process.
"""

from __future__ import annotations

import time


from bench_update import ACT, GOAL, HIDDEN, OBS, ab_line, ab_setup, ab_times, flop_floor, host
from her_agents.algos.registry import make_agent


def main() -> None:
    args, batch = ab_setup(__doc__)
    for algo in args.algos:
        agents, compile_s = {}, {}
        for variant in ("A", "B"):
            agent = make_agent(algo, OBS, GOAL, ACT, precision="bf16", layer_norm=True, compile=True)
            agent.cpp_wrapper = variant == "B"
            agent.update_normalizer(*host(batch.observation, batch.desired_goal))
            t0 = time.perf_counter()
            for _ in range(3):  # TD3 (policy_delay 2) compiles its step with and without the actor
                agent.update(batch)
            compile_s[variant] = time.perf_counter() - t0
            agents[variant] = agent
        floor_ms, _ = flop_floor(algo, batch, "bf16", HIDDEN, True, 20)
        times = ab_times(agents, batch, args.rounds)
        for variant, label in (("A", "Python wrapper"), ("B", "C++ wrapper")):
            print(f"{algo} bf16 compiled B={args.batch_size} {variant} ({label}): first compile "
                  f"{compile_s[variant]:.0f} s; {ab_line(times[variant], floor_ms)}", flush=True)

if __name__ == "__main__":
    main()

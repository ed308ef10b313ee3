"""Full-training speed on FetchPush-v4: our DDPG/TD3/SAC against Stable-Baselines3's with its HerReplayBuffer.

Stable-Baselines3 is not a dependency of the package; the ``[test]`` extra installs it (the SB3 adapter's tests)::

    python tests/benchmarks/bench_train_speed.py [--algos ddpg td3 sac] [--steps 4000] [--precision fp32|bf16]
        [--repeats N] [--update-every 5]

Both sides, in one process at one torch thread (``torch.set_num_threads(1)``), so the ratio is meaningful on a
shared machine even when absolute numbers drift:

- the same update schedule: 0.4 gradient updates per env step, done in blocks every ``--update-every`` N env
  steps (default 5; a multiple of 5), ours ``train.updates_per_step=0.4 train.update_every=N``, SB3
  ``train_freq=N`` steps with ``gradient_steps=0.4 N``; batch 256, 3x256 ReLU networks (SB3
  ``net_arch=[256, 256, 256]``), gamma 0.98, polyak 0.95 (SB3 ``tau=0.05``), Adam lr 1e-3, HER ``future``
  with k = 4, one FetchPush-v4 env, replay capacity 1e6;
- ``--warmup`` (1000) env steps of random actions without updates, then ``--steps`` (4000) env steps timed
  with learning on. Ours: :func:`her_agents.loop.train.train` with an evaluation (1 episode, excluded from the timed
  windows) every 1000 env steps, W&B and checkpoints off. SB3: ``model.learn`` with
  ``learning_starts=warmup``, timed from the callback at env step ``warmup`` to the end of ``learn``;
- per update, the time spent sampling the HER batch and in the gradient step (``agent.update`` for ours, SB3's
  ``train`` minus its ``replay_buffer.sample``), averaged over the timed run.

``--precision bf16`` runs ours with ``agent.precision=bf16`` (bf16 autocast forward passes in the update); SB3
always trains in float32.

The table has env steps/s for both and ours/SB3.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np
import torch

ENV_ID = "FetchPush-v4"
HIDDEN = [256, 256, 256]
BATCH, GAMMA, POLYAK, LR = 256, 0.98, 0.95, 1e-3
UPDATES_PER_STEP = 0.4


class Timer:
    """Wraps a callable and accumulates its calls' wall time."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


def run_ours(algo: str, warmup: int, steps: int, seed: int, precision: str = "fp32",
             update_every: int = 5) -> dict[str, float]:
    import her_agents.loop.start as start_mod
    import her_agents.loop.train as train_mod
    from her_agents.config import load_config

    timers: dict[str, Timer] = {}
    make_agent, build_replay = start_mod.make_agent, start_mod.build_replay

    def timed_make_agent(*args: Any, **kwargs: Any) -> Any:
        agent = make_agent(*args, **kwargs)
        timers["update"] = agent.update = Timer(agent.update)
        return agent

    def timed_build_replay(*args: Any, **kwargs: Any) -> Any:
        replay = build_replay(*args, **kwargs)
        timers["sample"] = replay.sample = Timer(replay.sample)
        return replay

    eval_every = 1000
    assert warmup % eval_every == 0 and steps % eval_every == 0
    cfg = load_config(
        None,
        [
            f"env.id={ENV_ID}",
            f"algo={algo}",
            f"train.total_env_steps={warmup + steps}",
            f"train.warmup_steps={warmup}",
            f"train.learning_starts={warmup}",
            f"train.updates_per_step={UPDATES_PER_STEP}",
            f"train.update_every={update_every}",
            f"train.batch_size={BATCH}",
            f"train.gamma={GAMMA}",
            f"train.eval_every={eval_every}",
            "train.eval_episodes=1",
            "env.eval_envs=1",
            f"train.seed={seed}",
            "train.device=cpu",
            "train.torch_threads=1",
            f"agent.hidden=[{','.join(map(str, HIDDEN))}]",
            f"agent.polyak={POLYAK}",
            f"agent.actor_lr={LR}",
            f"agent.critic_lr={LR}",
            f"agent.precision={precision}",
            "log.wandb.mode=disabled",
            "log.progress=false",
            "log.checkpoint=false",
        ],
    )
    start_mod.make_agent, start_mod.build_replay = timed_make_agent, timed_build_replay
    try:  # each run its own directory: a second algo (or repeat) would find the first's run there
        with tempfile.TemporaryDirectory(prefix=f"bench_train_speed-{algo}-") as run_dir:
            cfg.log.run_dir = run_dir
            result = train_mod.train(cfg)
    finally:
        start_mod.make_agent, start_mod.build_replay = make_agent, build_replay
    # each eval row holds the env steps/s of the window since the previous eval, eval time excluded
    windows = [r for r in result.history if r["env_steps"] > warmup]
    seconds = sum(eval_every / r["env_steps_per_s"] for r in windows)
    upd = timers["update"]
    return {
        "steps_per_s": steps / seconds,
        "updates": upd.calls,
        "update_ms": upd.seconds / max(upd.calls, 1) * 1e3,
        "sample_ms": timers["sample"].seconds / max(timers["sample"].calls, 1) * 1e3,
    }


def run_sb3(algo: str, warmup: int, steps: int, seed: int, update_every: int = 5) -> dict[str, float]:
    import gymnasium as gym
    import gymnasium_robotics
    from stable_baselines3 import DDPG, SAC, TD3, HerReplayBuffer
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.noise import NormalActionNoise

    gym.register_envs(gymnasium_robotics)
    env = gym.make(ENV_ID)
    kwargs: dict[str, Any] = dict(
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
        buffer_size=1_000_000,
        learning_starts=warmup,
        batch_size=BATCH,
        gamma=GAMMA,
        tau=1.0 - POLYAK,
        learning_rate=LR,
        train_freq=(update_every, "step"),
        gradient_steps=round(UPDATES_PER_STEP * update_every),
        policy_kwargs=dict(net_arch=HIDDEN),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    n_act = env.action_space.shape[0]
    if algo == "ddpg":
        model = DDPG(
            "MultiInputPolicy",
            env,
            action_noise=NormalActionNoise(np.zeros(n_act), 0.2 * np.ones(n_act)),
            **kwargs,
        )
    elif algo == "td3":
        model = TD3(
            "MultiInputPolicy",
            env,
            action_noise=NormalActionNoise(np.zeros(n_act), 0.2 * np.ones(n_act)),
            **kwargs,
        )
    else:
        model = SAC("MultiInputPolicy", env, ent_coef="auto", **kwargs)
    train_timer = model.train = Timer(model.train)
    sample_timer = model.replay_buffer.sample = Timer(model.replay_buffer.sample)

    class StartClock(BaseCallback):
        t_start = None

        def _on_step(self) -> bool:
            if self.num_timesteps == warmup:
                StartClock.t_start = time.perf_counter()
                train_timer.reset()
                sample_timer.reset()
            return True

    model.learn(total_timesteps=warmup + steps, callback=StartClock())
    seconds = time.perf_counter() - StartClock.t_start
    env.close()
    n_updates = train_timer.calls * model.gradient_steps
    return {
        "steps_per_s": steps / seconds,
        "updates": n_updates,
        "update_ms": (train_timer.seconds - sample_timer.seconds) / max(n_updates, 1) * 1e3,
        "sample_ms": sample_timer.seconds / max(sample_timer.calls, 1) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=["ddpg", "td3", "sac"])
    parser.add_argument(
        "--warmup", type=int, default=1000, help="random-action env steps before learning starts"
    )
    parser.add_argument(
        "--steps", type=int, default=4000, help="timed env steps with learning (multiple of 1000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate ours/SB3 this many times, keep the best"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--update-every", type=int, default=5,
        help="both: do the pending updates in a block every this many env steps (a multiple of 5)",
    )
    parser.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="our agents' precision (SB3: fp32)"
    )
    args = parser.parse_args()
    if args.update_every % 5:
        parser.error(f"--update-every must be a multiple of 5 (0.4 updates per env step), got {args.update_every}")

    torch.set_num_threads(1)
    import stable_baselines3

    print(
        f"{ENV_ID}: torch {torch.__version__}, SB3 {stable_baselines3.__version__}, 1 torch thread, "
        f"{UPDATES_PER_STEP} updates/env step in blocks every {args.update_every} env steps, batch {BATCH}, hidden {HIDDEN}, "
        f"{args.steps} timed env steps "
        f"after {args.warmup} warm-up steps; ours in {args.precision}, SB3 in fp32",
        flush=True,
    )
    results: dict[str, dict[str, dict[str, float]]] = {}
    for algo in args.algos:
        for _ in range(args.repeats):
            for side in ("ours", "sb3"):
                torch.set_num_threads(1)
                if side == "ours":
                    r = run_ours(algo, args.warmup, args.steps, args.seed, args.precision, args.update_every)
                else:
                    r = run_sb3(algo, args.warmup, args.steps, args.seed, args.update_every)
                print(
                    f"  {algo} {side}: {r['steps_per_s']:.1f} env steps/s, {r['updates']} updates, "
                    f"sample {r['sample_ms']:.2f} ms + update {r['update_ms']:.2f} ms per update",
                    flush=True,
                )
                best = results.setdefault(algo, {}).get(side)
                if best is None or r["steps_per_s"] > best["steps_per_s"]:
                    results[algo][side] = r

    header = (
        f"{'algo':<6}{'ours steps/s':>14}{'SB3 steps/s':>13}{'ratio':>8}"
        f"{'ours sample+update ms':>23}{'SB3 sample+update ms':>22}"
    )
    print(header)
    print("-" * len(header))
    for algo, r in results.items():
        o, s = r["ours"], r["sb3"]
        ratio = o["steps_per_s"] / s["steps_per_s"]
        print(
            f"{algo:<6}{o['steps_per_s']:>14.1f}{s['steps_per_s']:>13.1f}{ratio:>7.2f}x"
            f"{o['sample_ms']:>12.2f} + {o['update_ms']:<8.2f}"
            f"{s['sample_ms']:>11.2f} + {s['update_ms']:<8.2f}"
        )


if __name__ == "__main__":
    main()

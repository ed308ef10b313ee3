"""Env steps/s of ``her-train``'s default run in the one-run-owns-the-machine setting beside one thread serial,
in the same process, and where an env step's time goes in the fastest setting.

    python tests/benchmarks/bench_train_setting.py --steps 5000
    python tests/benchmarks/bench_train_setting.py --steps 2000 --no-compile --settings 1:serial 1:overlap

A setting is ``THREADS:LOOP``: ``train.torch_threads`` (``auto``: every core the process may use, less one per
env worker when overlapped, or a number)
and ``serial`` (act, step, store, update in turn) or ``overlap`` (``train.overlap_env``: the env steps in a
worker process while the updates run). Default: ``1:serial`` (one thread, the loop in turn: several runs side by
side) and ``auto:overlap`` (one run owns the machine). Each setting trains the config (default: ``her-train``'s,
FetchPush-v4 SAC) for its ``train.learning_starts`` env steps (no update yet), then ``--steps`` env steps timed
from the end of the first update (its compile, with ``agent.compile``, is not timed) to the final evaluation.
The settings run one after another in this process, so they see the same machine load; on a shared machine
compare them with each other, not with other runs.

The breakdown comes from timers this script wraps around the loop's functions (the loop carries none): per env
step of the timed window, the env step (the time the loop waits for it: all of it when serial, what the
updates did not hide when overlapped), acting, storing (replay and normalizers), updates (sample and gradient
step) and the rest of the loop; then evaluation, logging (``metrics.csv``) and checkpoint, timed once at the
final evaluation and spread over the config's ``train.eval_every`` env steps, as a training run pays them (the
checkpoint here holds the replay of a short run: a long run's appends more episodes).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from typing import Any

CATEGORIES = ("env step", "acting", "storing", "updates", "evaluation", "logging", "checkpoint")


class Timers:
    """Wall time per category of the functions wrapped with ``wrap``; a call inside another timed call counts
    for the outer one only (the env steps of an evaluation are evaluation)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.depth = 0

    def wrap(self, category: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[category] += time.perf_counter() - t0
                self.depth -= 1

        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)


def run_setting(setting: str, config: str | None, steps: int, compile_update: bool, extra: list[str]) -> dict:
    """Train ``config`` in ``setting`` (``THREADS:LOOP``) with the timers in place; returns the window's env
    steps/s, its per-category seconds and the final evaluation's."""
    import her_agents.loop.evaluation as evaluation_mod
    import her_agents.loop.start as start_mod
    import her_agents.loop.steps as steps_mod
    import her_agents.loop.train as train_mod
    from her_agents.cli import DEFAULT_CONFIG
    from her_agents.config import load_config, torch_thread_count
    from her_agents.run.logger import RunLogger

    threads, loop = setting.split(":")
    config = config or DEFAULT_CONFIG
    base = load_config(config, extra)
    cfg = load_config(config, [
        *extra, f"train.total_env_steps={base.train.learning_starts + steps}",
        f"train.eval_every={base.train.learning_starts + steps}", f"train.torch_threads={threads}",
        f"train.overlap_env={loop == 'overlap'}", f"agent.compile={compile_update}", "log.wandb.mode=disabled",
        "log.progress=false", "log.video_every=0",
    ])
    timers = Timers()
    window: dict[str, Any] = {"steps": 0, "t0": None}
    patches: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, new: Any) -> None:
        patches.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    def make_vector_env(*args: Any, **kwargs: Any) -> Any:
        env = real_make_vector_env(*args, **kwargs)
        if "grasped_start" in kwargs:  # the training envs (the eval envs' steps are evaluation)
            for name in ("step", "step_async", "step_wait"):
                if hasattr(env, name):
                    setattr(env, name, timers.wrap("env step", getattr(env, name)))
        return env

    def store_step(*args: Any, **kwargs: Any) -> Any:
        out = real_store_step(*args, **kwargs)
        window["steps"] += len(args[2])  # the actions: one per env
        return out

    def first_learn_step(*args: Any, **kwargs: Any) -> Any:  # the window starts once it (and a compile) is done
        out = real_first_learn_step(*args, **kwargs)
        timers.reset()
        window["steps"], window["t0"] = 0, time.perf_counter()
        return out

    def evaluate_and_checkpoint(*args: Any, **kwargs: Any) -> Any:
        window["t1"], window["seconds"] = time.perf_counter(), dict(timers.seconds)
        timers.reset()
        return real_evaluate_and_checkpoint(*args, **kwargs)

    real_make_vector_env, real_store_step = start_mod.make_vector_env, steps_mod.store_step
    real_first_learn_step, real_evaluate_and_checkpoint = steps_mod.first_learn_step, train_mod.evaluate_and_checkpoint
    patch(start_mod, "make_vector_env", make_vector_env)
    patch(steps_mod, "choose_action", timers.wrap("acting", steps_mod.choose_action))
    patch(steps_mod, "store_step", timers.wrap("storing", store_step))
    patch(steps_mod, "normalize_from_episode", timers.wrap("storing", steps_mod.normalize_from_episode))
    patch(steps_mod, "learn_step", timers.wrap("updates", steps_mod.learn_step))
    patch(steps_mod, "first_learn_step", first_learn_step)
    patch(train_mod, "evaluate_and_checkpoint", evaluate_and_checkpoint)
    patch(evaluation_mod, "evaluate", timers.wrap("evaluation", evaluation_mod.evaluate))
    patch(RunLogger, "log", timers.wrap("logging", RunLogger.log))
    patch(steps_mod, "write_checkpoint", timers.wrap("checkpoint", steps_mod.write_checkpoint))
    try:
        with tempfile.TemporaryDirectory(prefix="bench_train_setting-") as run_dir:
            cfg.log.run_dir = run_dir
            train_mod.train(cfg)
    finally:
        for obj, name, old in reversed(patches):
            setattr(obj, name, old)
    if window["t0"] is None:
        raise SystemExit(f"{setting}: no update ran (train.learning_starts {cfg.train.learning_starts})")
    seconds = window["t1"] - window["t0"]
    return {"setting": setting, "threads": torch_thread_count(cfg.train.torch_threads, start_mod.env_workers(cfg)),
            "steps": window["steps"], "seconds": seconds, "steps_per_s": window["steps"] / seconds,
            "window": window["seconds"], "eval": dict(timers.seconds), "eval_every": base.train.eval_every,
            "eval_episodes": cfg.train.eval_episodes, "env_id": cfg.env.id, "algo": cfg.algo}


def breakdown(r: dict) -> list[str]:
    """Milliseconds per env step and share of each category in ``r`` (``run_setting``'s)."""
    per_step = {k: v / r["steps"] * 1e3 for k, v in r["window"].items() if k not in ("evaluation", "logging",
                                                                                       "checkpoint")}
    per_step["rest of the loop"] = r["seconds"] / r["steps"] * 1e3 - sum(per_step.values())
    for k in ("evaluation", "logging", "checkpoint"):  # paid once per train.eval_every env steps
        per_step[k] = r["eval"][k] / r["eval_every"] * 1e3
    total = sum(per_step.values())
    notes = {"env step": "waiting for it", "storing": "replay, normalizers", "updates": "sample + gradient step",
             "evaluation": f"{r['eval']['evaluation']:.1f} s for {r['eval_episodes']} episodes, "
                           f"every {r['eval_every']} env steps",
             "logging": "metrics.csv row", "checkpoint": f"{r['eval']['checkpoint']:.2f} s each"}
    lines = [f"  {'':18} {'ms/env step':>11} {'share':>6}"]
    lines += [f"  {k:18} {v:11.3f} {v / total:6.1%}  {notes.get(k, '')}" for k, v in per_step.items()]
    lines.append(f"  {'total':18} {total:11.3f} {1:6.0%}  = {1e3 / total:.0f} env steps/s with evaluations")
    return lines


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    from her_agents.config import usable_cores

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5000, help="timed env steps per setting (after learning_starts)")
    ap.add_argument("--settings", nargs="+", default=["1:serial", "auto:overlap"],
                    help="THREADS:LOOP, THREADS auto or a number, LOOP serial or overlap")
    ap.add_argument("--config", default=None, help="config name or file (default: her-train's)")
    ap.add_argument("--no-compile", action="store_true", help="agent.compile=false (no compile before the window)")
    ap.add_argument("--all-breakdowns", action="store_true", help="the breakdown of every setting, not only the fastest")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides, e.g. train.batch_size=512")
    args = ap.parse_args(argv)
    for s in args.settings:
        threads, _, loop = s.partition(":")
        if loop not in ("serial", "overlap") or not (threads == "auto" or threads.isdigit() and int(threads) >= 1):
            ap.error(f"--settings: expected THREADS:LOOP (THREADS auto or >= 1, LOOP serial or overlap), got {s!r}")
    os.environ.setdefault("WANDB_MODE", "disabled")
    results = [run_setting(s, args.config, args.steps, not args.no_compile, args.overrides) for s in args.settings]
    first = results[0]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{first['env_id']}, {first['algo']}, {args.steps} timed env steps per setting, {cpu_name()}, "
          f"{usable_cores()} cores usable, OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}, load average "
          f"{load:.1f} at the end (the settings ran one after another)")
    print(f"  {'setting':14} {'threads':>7} {'env steps/s':>11}  (timed window: no evaluation)")
    for r in results:
        print(f"  {r['setting']:14} {r['threads']:7d} {r['steps_per_s']:11.1f}  "
              f"x{r['steps_per_s'] / first['steps_per_s']:.2f} of {first['setting']}")
    best = max(results, key=lambda r: r["steps_per_s"])
    for r in [best] + ([r for r in results if r is not best] if args.all_breakdowns else []):
        print(f"\nwhere an env step's time goes, {r['setting']}{' (the fastest)' if r is best else ''}:")
        print("\n".join(breakdown(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

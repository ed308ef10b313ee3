"""Command line: ``her-train [CONFIG] [key=value ...]`` and ``her-eval CHECKPOINT`` (also ``pretrained:NAME``, a
shipped policy, and ``--list-pretrained``)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .tools import OneLineErrorParser, add_version_option, allocation_failure, cli_entry, print_to_pipe

if TYPE_CHECKING:
    from .config import Config
    from .loop.train import TrainResult

__all__ = ["eval_main", "eval_parser", "run_training", "train_main", "train_parser"]

DEFAULT_CONFIG = "fetch_push_sac"


def run_training(cfg: Config, resume: str | None = None, overwrite: bool = False) -> TrainResult:
    """This process's training: the plain loop (``her_agents.loop.train.train``), or under torchrun its rank's part
    of a data-parallel (``dist.mode=data_parallel``) or actor-learner (``dist.mode=actor_learner``) run. One
    process (no ``WORLD_SIZE`` above 1) runs the plain loop without entering [`her_agents.distributed`][]."""
    if cfg.dist.mode == "actor_learner":
        from .distributed.actor_learner import train_actor_learner

        return train_actor_learner(cfg, resume, overwrite)
    from .run.run_control import launch_int

    if launch_int("WORLD_SIZE", 1) <= 1:  # as her_agents.distributed.launch.rendezvous_env reads it
        from .loop.train import train

        return train(cfg, resume, overwrite)
    from .distributed.data_parallel import train_data_parallel

    return train_data_parallel(cfg, resume, overwrite)


def train_parser() -> argparse.ArgumentParser:
    """The ``her-train`` argument parser (every option's help gives its default)."""
    parser = OneLineErrorParser(
        prog="her-train",
        description="Train a goal-conditioned agent with HER. CONFIG is a YAML path or a name in configs/ "
        f"(default {DEFAULT_CONFIG}); key=value pairs override it, e.g. train.total_env_steps=20000 algo=td3.",
    )
    parser.add_argument("config", nargs="?", default=None, help=f"YAML path or configs/ name (default "
                        f"{DEFAULT_CONFIG}; not with --resume, which uses the run's own config)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (dotted keys; default: none)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint "
                        "(overrides may change e.g. train.total_env_steps, train.eval_*, log.*; default: start "
                        "a new run)")
    parser.add_argument("--overwrite", action="store_true", help="start a fresh run in a log.run_dir that holds "
                        "another run (its files are replaced as the new run writes its own; default: refuse)")
    parser.add_argument("--print-config", action="store_true", help="print the merged config and exit "
                        "(default: train)")
    add_version_option(parser)
    return parser


def _after_write_error(exc: OSError) -> str:
    """What to do after a run stopped on a file of its run directory it could not write: continue from the
    last checkpoint (every ``metrics.csv`` row left is covered by it), or start again without one."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not exc.filename:
        return ""
    run_dir = Path(exc.filename).parent
    if (run_dir / "checkpoint.pt").is_file():
        return f"; free space, then continue with `her-train --resume {run_dir}`"
    return "; free space, then start the run again (no checkpoint was written yet)"


def _resumed_config(args: argparse.Namespace) -> Config | None:
    """The config of the run ``args.resume`` continues, with ``args.overrides``; None when that run is complete
    (said on stdout).

    Raises:
        ValueError: options that contradict a resume, a file given for the run directory, a total below the
            steps done; FileNotFoundError: no checkpoint there.
    """
    from .config import resume_config
    from .run.checkpoint import load_checkpoint

    if args.overwrite:
        raise ValueError("--overwrite starts a fresh run; it cannot be combined with --resume")
    if args.config is not None:
        raise ValueError(f"--resume {args.resume} continues the run with its own config: drop the config "
                         f"{args.config!r} (key=value overrides are allowed)")
    if os.path.isfile(args.resume):  # her-eval takes a checkpoint file; --resume takes the whole run
        raise ValueError(f"--resume takes the run directory, got the file {args.resume}: use --resume "
                         f"{os.path.dirname(args.resume) or '.'}")
    saved = load_checkpoint(os.path.join(args.resume, "checkpoint.pt"))
    cfg = resume_config(saved["config"], args.overrides)  # the run's config, then the overrides
    done, total = saved["counters"]["env_steps"], cfg.train.total_env_steps
    if done > total and any(o.partition("=")[0].strip() == "train.total_env_steps" for o in args.overrides):
        raise ValueError(f"train.total_env_steps must be above the {done} env steps the run in "
                         f"{args.resume} has done, got {total}")
    if done >= total and not args.print_config:
        print(f"her-train: the run in {args.resume} is complete ({done}/{total} env steps); raise "
              "train.total_env_steps to continue it, e.g. train.total_env_steps=" + str(2 * total))
        return None
    return cfg


def _last_checkpoint_hint(cfg: Config, args: argparse.Namespace) -> str:
    """After a stop without its own checkpoint (a second Ctrl-C): where the last one is, if the run has one."""
    run_dir = args.resume or cfg.log.run_dir
    if not run_dir or not (Path(run_dir) / "checkpoint.pt").exists():
        return " (no checkpoint written)" if run_dir else ""
    return (f" before its own checkpoint; the last one is in {run_dir}: continue from it with "
            f"`her-train --resume {run_dir}`")


def _train_and_report(cfg: Config, args: argparse.Namespace) -> int:
    """Run the training; the exit status, with one line on stderr for what stopped it early."""
    from .loop.collect import NetworksDiverged
    from .run.run_control import LaunchError, RunFailed, TrainingStopped
    from her_envs import EnvWorkerDied

    try:
        result = run_training(cfg, resume=args.resume, overwrite=args.overwrite)
    except TrainingStopped as exc:
        print(f"her-train: {exc}", file=sys.stderr)
        return exc.exit_code
    except RunFailed as exc:  # a dead env worker, diverged networks: the line says what to do
        print(f"her-train: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (EnvWorkerDied, NetworksDiverged) as exc:  # the same outside the plain loop (the actor-learner)
        print(f"her-train: error: {exc}", file=sys.stderr)
        return 1
    except LaunchError as exc:  # torchrun's variables, dist.backend, a process group that does not form
        print(f"her-train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C, or one before training started
        print("her-train: interrupted" + _last_checkpoint_hint(cfg, args), file=sys.stderr)
        return 130
    except (ValueError, TypeError) as exc:
        print(f"her-train: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # numpy's error names the size; the replay buffer is what is that large
        what = str(exc).split(" and data type")[0]  # numpy appends the whole structured dtype
        print(f"her-train: error: out of memory ({what}); lower replay.capacity (now {cfg.replay.capacity})",
              file=sys.stderr)
        return 2
    except RuntimeError as exc:  # torch's allocator during the updates (a batch too large for the device)
        asked = allocation_failure(exc)
        if asked is None:
            raise
        print(f"her-train: error: out of memory: torch asked for {asked}; lower train.batch_size (now "
              f"{cfg.train.batch_size}) or agent.hidden (now {list(cfg.agent.hidden)})", file=sys.stderr)
        return 2
    except BrokenPipeError as exc:
        if exc.filename:
            raise
        # stdout's reader ended (`her-train ... | head`): nothing more can be shown there
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        print("her-train: error: the program reading its output ended (a closed pipe), so the run stopped"
              + _last_checkpoint_hint(cfg, args).replace(" before its own checkpoint", "")
              + "; send the output to a file instead (`her-train ... > train.log`)", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. a full disk: every file written so far is complete (atomic writes)
        print(f"her-train: error: cannot write {exc.filename or 'to the run directory'}: "
              f"{exc.strerror or exc}{_after_write_error(exc)}", file=sys.stderr)
        return 1
    if result.history:  # ranks other than 0 (torchrun) have no evaluation rows of their own
        print(f"final eval success rate {result.eval_success_rate:.3f} after {result.env_steps} env steps; "
              f"run directory {result.run_dir}")
    return 0


@cli_entry("her-train")
def train_main(argv: list[str] | None = None) -> int:
    parser = train_parser()
    args = parser.parse_intermixed_args(argv)  # options may come between CONFIG and the overrides
    if args.config is not None and "=" in args.config:  # only overrides were given
        args.overrides.insert(0, args.config)
        args.config = None

    from .config import config_yaml, load_config

    try:
        cfg = _resumed_config(args) if args.resume else load_config(args.config or DEFAULT_CONFIG, args.overrides)
        if cfg is None:
            return 0
        if args.print_config:  # torch-free (but for --resume, which reads the checkpoint)
            return print_to_pipe(config_yaml(cfg))
        from .run.logger import check_wandb_env
        from .run.video import prepare_gl

        prepare_gl(video=cfg.log.video_every > 0)  # before `import mujoco`, which loads MUJOCO_GL's library
        check_wandb_env()  # W&B refuses an unknown WANDB_MODE at every init, offline ones included
    except (ValueError, FileNotFoundError, RuntimeError) as exc:  # one line, no usage text: the message says
        print(f"her-train: error: {exc}", file=sys.stderr)  # what to fix
        return 2
    return _train_and_report(cfg, args)


def eval_parser() -> argparse.ArgumentParser:
    """The ``her-eval`` argument parser (every option's help gives its default)."""
    parser = OneLineErrorParser(prog="her-eval", description="Evaluate a checkpoint (deterministic policy).")
    parser.add_argument("checkpoint", nargs="?", help="checkpoint.pt, a run directory, a her-export directory "
                        "or pretrained:NAME, a policy shipped with the package (see --list-pretrained)")
    parser.add_argument("--list-pretrained", action="store_true", help="list the shipped policies' names and exit")
    parser.add_argument("--episodes", type=int, default=50, help="evaluation episodes (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=12345,
                        help="seed of the evaluation envs and of the video episodes (default: %(default)s)")
    parser.add_argument("--video", metavar="PATH", help="also render episodes headless to an .mp4 or .gif "
                        "(default: no video)")
    parser.add_argument("--video-episodes", type=int, default=2,
                        help="episodes in the video (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device of the policy (default: %(default)s)")
    add_version_option(parser)
    return parser


#: the most episodes her-eval runs (about a day of FetchReach episodes on one core)
MAX_EVAL_EPISODES = 1_000_000


def _check_eval_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """Refuse bad ``her-eval`` options (through ``parser.error``, which exits 2) before anything loads; returns
    the line for an environment that cannot work (a video path that cannot be written, a bad ``MUJOCO_GL``)."""
    for flag, value in (("--episodes", args.episodes), ("--video-episodes", args.video_episodes)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
        if value > MAX_EVAL_EPISODES:  # numpy's int64 episode shares overflow on a 20-digit count
            parser.error(f"{flag} must be at most {MAX_EVAL_EPISODES}, got {value}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.seed >= 2**32 - 10_000:  # the envs are seeded seed + i: train.seed's range
        parser.error(f"--seed must be below 2**32 - 10000, got {args.seed}")
    if args.video and os.path.splitext(args.video)[1].lower() not in (".mp4", ".gif"):
        parser.error(f"--video {args.video}: the file must end in .mp4 or .gif")
    from .config import check_device
    from .run.checkpoint import check_writable
    from .run.video import prepare_gl

    try:
        check_device(args.device, "--device")
    except ValueError as exc:
        parser.error(str(exc))
    if args.video:
        try:
            check_writable(args.video)  # before the evaluation, which the video would otherwise only follow
        except OSError as exc:
            return f"--video {args.video}: cannot write {exc.filename} ({exc.strerror})"
    try:
        prepare_gl(video=bool(args.video))  # before `import mujoco`, which loads MUJOCO_GL's library
    except RuntimeError as exc:
        return str(exc)
    return None


def _record_video(agent, env_id: str, args: argparse.Namespace) -> int:
    """Record ``args.video_episodes`` episodes of ``agent`` into ``args.video``; the exit status."""
    from .run.video import record_episodes, write_video

    try:
        frames, successes = record_episodes(agent, env_id, n_episodes=args.video_episodes, seed=args.seed)
    except RuntimeError as exc:
        print(f"her-eval: no video: {exc}", file=sys.stderr)
        return 1
    try:
        write_video(args.video, frames)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"her-eval: cannot write {args.video}: {exc}", file=sys.stderr)
        return 1
    print(f"video: {args.video} ({len(frames)} frames, {frames.shape[2]}x{frames.shape[1]}, "
          f"successes {successes})")
    return 0


def _is_policy_file(target: str) -> bool:
    """Whether ``her-eval`` takes ``target`` as a policy (``pretrained:NAME``, a ``her-export`` directory or model
    file) rather than a checkpoint or run directory."""
    from .run.policy_file import MODEL_FILES, read_policy_file

    if target.startswith("pretrained:") or target.endswith(".safetensors"):
        return True
    if os.path.isdir(target):
        return not os.path.isfile(os.path.join(target, "checkpoint.pt")) and any(
            os.path.isfile(os.path.join(target, m)) for m in MODEL_FILES)
    if os.path.basename(target) == "model.pt" and os.path.isfile(target):
        try:  # a checkpoint may be named model.pt too
            read_policy_file(target)
        except ValueError:
            return False
        return True
    return False


def _eval_policy_file(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``her-eval`` of a shipped policy (``pretrained:NAME``) or of a ``her-export`` file or directory."""
    from .loop.train import evaluate
    from .pretrained import PREFIX, load_pretrained
    from .run.policy_file import load_policy
    from her_envs import make_vector_env

    try:
        if args.checkpoint.startswith(PREFIX):
            policy = load_pretrained(args.checkpoint, device=args.device)
        else:
            policy = load_policy(args.checkpoint, device=args.device)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    env = make_vector_env(policy.env_id, min(args.episodes, 10), "sync", seed=args.seed)
    ev = evaluate(policy.agent, env, args.episodes)
    env.close()
    print(f"{policy.env_id} {policy.algo} ({args.checkpoint}, {policy.metadata['dtype']}): success rate "
          f"{ev['success_rate']:.3f} over {args.episodes} episode{'s' if args.episodes != 1 else ''}, "
          f"mean final distance {ev['final_distance']:.4f}")
    return _record_video(policy.agent, policy.env_id, args) if args.video else 0


@cli_entry("her-eval")
def eval_main(argv: list[str] | None = None) -> int:
    parser = eval_parser()
    args = parser.parse_args(argv)
    if args.list_pretrained:
        from .pretrained import names

        return print_to_pipe("\n".join(names()))
    if args.checkpoint is None:
        parser.error("give a checkpoint, a run directory or pretrained:NAME (--list-pretrained lists the names)")
    problem = _check_eval_args(parser, args)
    if problem:
        print(f"her-eval: error: {problem}", file=sys.stderr)
        return 2
    if _is_policy_file(args.checkpoint):
        return _eval_policy_file(parser, args)

    import torch

    from .run.checkpoint import load_checkpoint
    from .algos.registry import agent_from_checkpoint
    from .config import torch_thread_count
    from .loop.train import evaluate
    from her_envs import make_vector_env

    try:
        state = load_checkpoint(args.checkpoint)
    except (FileNotFoundError, ValueError) as exc:  # load_checkpoint's message names the file and what is wrong
        parser.error(str(exc))
    except Exception as exc:
        parser.error(f"{args.checkpoint} is not a readable her-robotics checkpoint ({type(exc).__name__}: {exc})")
    cfg = state["config"]
    torch.set_num_threads(torch_thread_count(cfg["train"].get("torch_threads")))
    try:
        agent = agent_from_checkpoint(state, device=args.device)
        env = make_vector_env(cfg["env"]["id"], min(args.episodes, 10), "sync", seed=args.seed)
    except (RuntimeError, ValueError, TypeError) as exc:  # MuJoCo's GL set-up at import; an env module not found
        print(f"her-eval: error: cannot build {cfg['env']['id']}: {exc}", file=sys.stderr)
        return 2
    ev = evaluate(agent, env, args.episodes)
    env.close()
    print(f"{cfg['env']['id']} {cfg['algo']} @ {state['counters']['env_steps']} env steps: "
          f"success rate {ev['success_rate']:.3f} over {args.episodes} episode{'s' if args.episodes != 1 else ''}, "
          f"mean final distance {ev['final_distance']:.4f}")
    return _record_video(agent, cfg["env"]["id"], args) if args.video else 0


if __name__ == "__main__":
    sys.exit(train_main())

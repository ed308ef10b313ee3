"""``her-export RUN_DIR OUT_DIR``: a run's policy as a small, self-contained directory in the layout of a
Hugging Face Hub model repo (upload it with the Hub's own client, e.g. ``huggingface-cli upload``; this package
makes no network call):

- ``model.safetensors`` (``model.pt`` without the ``safetensors`` package): the actor and the normalizers'
  statistics only (``her_agents.run.policy_file``), float16 when its success rate holds, else float32;
- ``config.yaml``: the run's config;
- ``results.json``: the success rate measured on ``--episodes`` episodes of the exported file itself, the
  training env steps and wall time, the commit;
- ``README.md``: the model card (Hub metadata in its YAML header, then the results and how to run it);
- ``replay.mp4`` with ``--video``.

The shipped policies (``her_agents.pretrained``) are such directories; ``scripts/measure_pretrained.py``
re-measures their ``results.json`` and card with ``measure`` and ``write_card``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from ..config import torch_thread_count
from ..tools import OneLineErrorParser, add_version_option, cli_entry
from .checkpoint import write_atomic
from .policy_file import MODEL_FILES, load_policy, safetensors_available, write_policy_file

__all__ = ["export_parser", "export_run", "main", "measure", "model_card", "source_commit", "write_card", "write_results"]

DEFAULT_EPISODES = 100
EVAL_SEED = 12345  # her-eval's default --seed: the same episodes as `her-eval --episodes N`


def source_commit() -> str | None:
    """The git commit of the her-robotics source this runs from (``-dirty`` appended for uncommitted changes to
    tracked files), or None outside a git checkout (an installed wheel). Runs do not record their commit, so an
    export of an older run says the commit it was exported from; ``--commit`` states the training commit."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def measure(policy_path: str | Path, episodes: int = DEFAULT_EPISODES, seed: int = EVAL_SEED,
            device: str = "cpu") -> dict[str, Any]:
    """Evaluate the policy file at ``policy_path`` (or an exported directory) on ``episodes`` deterministic
    episodes (``her_agents.loop.evaluation.evaluate``, eval envs seeded ``seed`` as ``her-eval`` does).

    Returns:
        ``success_rate``, ``final_distance`` (metres for Fetch), ``return``, ``episodes``, ``eval_seed``.
    """
    from ..loop.train import evaluate
    from her_envs import make_vector_env

    policy = load_policy(policy_path, device=device)
    env = make_vector_env(policy.env_id, min(episodes, 10), "sync", seed=seed)
    try:
        ev = evaluate(policy.agent, env, episodes)
    finally:
        env.close()
    return {**{k: round(float(v), 6) for k, v in ev.items()}, "episodes": int(episodes), "eval_seed": int(seed)}


def write_results(out_dir: Path, results: dict[str, Any]) -> None:
    """``results.json`` in ``out_dir``, atomically."""
    text = (json.dumps(results, indent=2, sort_keys=True) + "\n").encode()
    write_atomic(out_dir / "results.json", lambda f: f.write(text))


def model_card(config: dict[str, Any], results: dict[str, Any], name: str | None = None) -> str:
    """The model card (``README.md``) of an exported policy: Hugging Face Hub metadata (YAML header with a
    ``model-index`` entry of the measured success rate), then what it is, its results and how to run it.
    ``name``: the ``pretrained:`` name of a shipped policy (None for a user's export)."""
    env_id, algo = config["env"]["id"], str(config["algo"])
    sr, n = results["success_rate"], results["episodes"]
    minutes = results.get("wall_time_s", 0.0) / 60
    run_line = (f"her-eval pretrained:{name} --episodes {n}" if name else f"her-eval path/to/this/directory/{results['file']}")
    return f"""---
library_name: her-robotics
tags:
- reinforcement-learning
- goal-conditioned
- hindsight-experience-replay
- {algo}
- {env_id}
model-index:
- name: {algo.upper()} + HER on {env_id}
  results:
  - task:
      type: reinforcement-learning
      name: reinforcement-learning
    dataset:
      name: {env_id}
      type: {env_id}
    metrics:
    - type: success_rate
      value: {sr:.3f}
      name: success rate ({n} episodes)
---

# {algo.upper()} + HER on {env_id}

A goal-conditioned policy trained with her-robotics (Hindsight Experience Replay).
This directory holds only what acting needs: the actor's weights ({results['dtype']}) and the observation and
goal normalizers' statistics, in `{results['file']}` ({results['file_bytes'] / 1024:.0f} KiB, read without
unpickling code), and the run's config in `config.yaml`.

| | |
|---|---|
| success rate | **{sr:.3f}** on {n} deterministic episodes of this file (eval seed {results['eval_seed']}) |
| mean final distance | {results['final_distance']:.4f} m |
| training | {results['env_steps']:,} env steps, {minutes:.1f} min wall time |
| algorithm | {algo}, config `{results.get('config_name') or 'config.yaml'}` |
| commit | {results.get('commit') or 'unknown'} |

The success rate is measured on {'the shipped file itself by scripts/measure_pretrained.py' if name else 'the exported file itself'}
(`results.json`), not copied from the run's log.

## Use

```bash
{run_line}
```

```python
from her_agents.run.policy_file import load_policy
policy = load_policy("{results['file']}")
action = policy.agent.act(obs["observation"], obs["desired_goal"], deterministic=True)
```
"""


def write_card(out_dir: Path, config: dict[str, Any], results: dict[str, Any], name: str | None = None) -> None:
    """``README.md`` (``model_card``) in ``out_dir``, atomically."""
    text = model_card(config, results, name).encode()
    write_atomic(out_dir / "README.md", lambda f: f.write(text))


def _write_video(policy_path: Path, out_dir: Path, episodes: int, seed: int) -> str:
    from .video import record_episodes, write_video

    policy = load_policy(policy_path)
    frames, successes = record_episodes(policy.agent, policy.env_id, n_episodes=episodes, seed=seed)
    write_video(out_dir / "replay.mp4", frames)
    return f"replay.mp4 ({len(frames)} frames, successes {successes})"


def export_run(run_dir: str | Path, out_dir: str | Path, episodes: int = DEFAULT_EPISODES, seed: int = EVAL_SEED,
               dtype: str = "auto", tolerance: float = 0.01, file_format: str = "auto", video: int = 0,
               commit: str | None = None, overwrite: bool = False, log: Any = print) -> dict[str, Any]:
    """Export the policy of the run in ``run_dir`` (its ``checkpoint.pt``) to ``out_dir``.

    Args:
        episodes, seed: the evaluation of the exported file (``results.json``).
        dtype: ``"float16"``, ``"float32"`` or ``"auto"``: float16 when its success rate on the same episodes
            is at least float32's less ``tolerance``, else float32.
        file_format: ``"safetensors"``, ``"torch"`` (``model.pt``) or ``"auto"`` (safetensors if installed).
        video: episodes rendered into ``replay.mp4`` (0: none).
        commit: the training commit for the card (default ``source_commit``).
        overwrite: replace an existing export in ``out_dir`` (default: refuse a non-empty directory).
        log: where progress lines go.

    Returns:
        the ``results.json`` content.

    Raises:
        FileNotFoundError: no checkpoint in ``run_dir``.
        ValueError: a bad option, an unreadable checkpoint, a non-empty ``out_dir`` without ``overwrite``.
        OSError: ``out_dir`` cannot be written.
    """
    from ..algos.registry import agent_from_checkpoint
    from .checkpoint import load_checkpoint

    if dtype not in ("auto", "float16", "float32"):
        raise ValueError(f"--dtype must be auto, float16 or float32, got {dtype!r}")
    if file_format not in ("auto", "safetensors", "torch"):
        raise ValueError(f"--format must be auto, safetensors or torch, got {file_format!r}")
    if file_format == "safetensors" and not safetensors_available():
        raise ValueError("--format safetensors needs the safetensors package (pip install safetensors)")
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    if not 0 <= tolerance <= 1:  # a success-rate difference; also refuses nan
        raise ValueError(f"--tolerance must be a success-rate difference in [0, 1], got {tolerance}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"OUT_DIR {out_dir} is a file, not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ValueError(f"OUT_DIR {out_dir} is not empty: pass --overwrite to replace its export")
    state = load_checkpoint(Path(run_dir) / "checkpoint.pt" if Path(run_dir).is_dir() else run_dir)
    config = state["config"]
    torch.set_num_threads(torch_thread_count(config["train"].get("torch_threads")))
    agent = agent_from_checkpoint(state, device="cpu", compile=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    use_st = file_format == "safetensors" or (file_format == "auto" and safetensors_available())
    model = out_dir / (MODEL_FILES[0] if use_st else MODEL_FILES[1])
    for other in MODEL_FILES:  # one model file per directory: a stale one of the other format would be loaded
        if other != model.name:
            (out_dir / other).unlink(missing_ok=True)

    def write_and_measure(dt: torch.dtype) -> dict[str, Any]:
        write_policy_file(model, agent, config, dt)
        result = measure(model, episodes, seed)
        log(f"{str(dt).removeprefix('torch.')}: success rate {result['success_rate']:.3f} over {episodes} "
            f"episodes ({model.stat().st_size / 1024:.0f} KiB)")
        return result

    if dtype == "auto":
        ev32 = write_and_measure(torch.float32)
        chosen, ev = torch.float16, write_and_measure(torch.float16)
        if ev["success_rate"] < ev32["success_rate"] - tolerance:
            chosen, ev = torch.float32, ev32
            write_policy_file(model, agent, config, chosen)  # the same bytes as the file measured
    else:
        chosen = torch.float16 if dtype == "float16" else torch.float32
        ev = write_and_measure(chosen)
    counters = state["counters"]
    config_text = (Path(run_dir) / "config.yaml").read_text() if (Path(run_dir) / "config.yaml").is_file() else None
    if config_text is None:
        from omegaconf import OmegaConf

        config_text = OmegaConf.to_yaml(OmegaConf.create(config))
    write_atomic(out_dir / "config.yaml", lambda f: f.write(config_text.encode()))
    results = {
        "env_id": config["env"]["id"], "algo": str(config["algo"]), **ev,
        "dtype": str(chosen).removeprefix("torch."), "file": model.name, "file_bytes": model.stat().st_size,
        "env_steps": int(counters["env_steps"]), "wall_time_s": round(float(counters.get("wall_time", 0.0)), 1),
        "seed": int(config["train"]["seed"]), "commit": commit or source_commit(),
    }
    write_results(out_dir, results)
    write_card(out_dir, config, results)
    if video:
        try:
            log(_write_video(model, out_dir, video, seed))
        except (RuntimeError, OSError, ValueError) as exc:
            log(f"her-export: no video: {exc}")
    return results


def export_parser() -> OneLineErrorParser:
    """The ``her-export`` argument parser (every option's help gives its default)."""
    parser = OneLineErrorParser(
        prog="her-export",
        description="Export a run's policy (actor + normalizer statistics) with its config, measured results and a "
        "model card to OUT_DIR, in the layout of a Hugging Face Hub model repo. No network call.")
    add_version_option(parser)
    parser.add_argument("run_dir", help="a run directory (or its checkpoint.pt)")
    parser.add_argument("out_dir", help="the directory to write (created; must be empty unless --overwrite)")
    parser.add_argument("--episodes", type=int, default=DEFAULT_EPISODES,
                        help="episodes measured on the exported file (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED, help="eval envs' seed (default: %(default)s)")
    parser.add_argument("--dtype", default="auto", help="float16, float32 or auto: float16 when its success rate "
                        "is within --tolerance of float32's on the same episodes (default: %(default)s)")
    parser.add_argument("--tolerance", type=float, default=0.01,
                        help="success-rate loss float16 may have (default: %(default)s)")
    parser.add_argument("--format", dest="file_format", default="auto", help="safetensors, torch (model.pt) or "
                        "auto: safetensors when the package is installed (default: %(default)s)")
    parser.add_argument("--video", type=int, nargs="?", const=2, default=0, metavar="EPISODES",
                        help="also render EPISODES episodes (2 if not given) to replay.mp4 (default: %(default)s, no video)")
    parser.add_argument("--commit", help="the training commit for the card (default: this source's git commit, "
                        "or unknown outside a git checkout)")
    parser.add_argument("--overwrite", action="store_true", help="replace an export in a non-empty OUT_DIR")
    return parser


@cli_entry("her-export")
def main(argv: list[str] | None = None) -> int:
    """``her-export RUN_DIR OUT_DIR [--episodes N] [--dtype auto|float16|float32] [--video [N]]``."""
    parser = export_parser()
    args = parser.parse_args(argv)
    from .video import prepare_gl

    try:
        prepare_gl(video=bool(args.video))  # before `import mujoco`, which loads MUJOCO_GL's library
    except RuntimeError as exc:
        parser.error(str(exc))
    try:
        results = export_run(args.run_dir, args.out_dir, episodes=args.episodes, seed=args.seed, dtype=args.dtype,
                             tolerance=args.tolerance, file_format=args.file_format, video=args.video,
                             commit=args.commit, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    except OSError as exc:
        print(f"her-export: error: cannot write {exc.filename or args.out_dir}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    print(f"{results['env_id']} {results['algo']}: {results['file']} {results['dtype']} "
          f"({results['file_bytes'] / 1024:.0f} KiB), success rate {results['success_rate']:.3f} over "
          f"{results['episodes']} episodes; wrote {os.path.join(args.out_dir, '')}"
          "{README.md,config.yaml,results.json" + (",replay.mp4}" if args.video else "}"))
    return 0

"""Check that committed runs were trained with a config and print their eval success at a step.

Each ``results/<run>/config.yaml``, read as a resume reads it (keys added since take their defaults), equals ``her-train CONFIG train.seed=S --print-config`` except the seed,
``train.total_env_steps``, the resources (``train.torch_threads``) and the ``log.*`` keys (run directory, W&B
mode, progress bar: not what is learned); prints
each seed's eval success at ``--at`` env steps (from its ``metrics.csv``) and their mean.

    python scripts/check_results_configs.py fetch_pick_and_place_ddpg 'results/pnp_ddpg_grs_s*' --at 350000

Exits with 1 when a run's config differs (the differing keys are printed) or has no row at ``--at``; with 2 and
one line for bad input (an unknown config, a folder without ``config.yaml`` or ``metrics.csv``).
"""

from __future__ import annotations

import argparse
import csv
import glob
import sys
from pathlib import Path

import yaml

from her_agents.config import load_config, resume_config
from her_agents.distributed.launch import flat_config

#: keys a run may set apart from its config: the seed, the length, and what it ran on (``train.torch_threads``:
#: how many cores it used, not what it learns from)
IGNORED = {"train.seed", "train.total_env_steps", "train.torch_threads"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="config name, e.g. fetch_push_td3")
    ap.add_argument("runs", help="glob of run folders, e.g. 'results/push_td3_ebp_s*'")
    ap.add_argument("--at", type=int, required=True, help="env steps at which to read eval success")
    args = ap.parse_args(argv)
    runs = sorted(glob.glob(args.runs))
    if not runs:
        print(f"runs: no folder matches {args.runs!r}", file=sys.stderr)
        return 1
    try:
        load_config(args.config)
    except (ValueError, FileNotFoundError) as exc:
        print(f"config: {exc}", file=sys.stderr)
        return 2
    for run in runs:
        for name in ("config.yaml", "metrics.csv"):
            if not (Path(run) / name).is_file():
                print(f"runs: {run} has no {name} (a run folder holds config.yaml and metrics.csv)", file=sys.stderr)
                return 2
    ok, values = True, []
    for run in runs:
        saved = yaml.safe_load((Path(run) / "config.yaml").read_text())
        ran = flat_config(resume_config(saved))
        want = flat_config(load_config(args.config, [f"train.seed={ran['train.seed']}"]))
        diff = sorted(k for k in set(ran) | set(want)
                      if k not in IGNORED and not k.startswith("log.") and ran.get(k) != want.get(k))
        with open(Path(run) / "metrics.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(float(r["env_steps"])) == args.at]
        success = float(rows[-1]["eval/success_rate"]) if rows else None
        ok &= not diff and success is not None
        values.append(success)
        what = "config equal" if not diff else "config differs: " + ", ".join(
            f"{k} ran {ran.get(k)!r}, config {want.get(k)!r}" for k in diff)
        at = f"eval success at {args.at}: {success}" if rows else f"no evaluation row at {args.at} env steps"
        print(f"{run} (seed {ran['train.seed']}): {what}; {at}")
    if all(v is not None for v in values):
        print(f"{args.config}: mean of {len(values)} at {args.at}: {sum(values) / len(values):.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

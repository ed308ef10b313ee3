"""Measure the shipped policies (``agents/pretrained/<name>/``) and write what their cards say.

For each name (default: every shipped one), evaluates the shipped model file itself on ``--episodes`` (100)
deterministic episodes, as ``her-eval pretrained:<name> --episodes 100`` does, and rewrites the directory's
``results.json`` (the evaluation fields; the training ones, env steps, wall time, commit, stay as ``her-export``
wrote them) and its ``README.md`` card from it. The cards' success rates come from here, never from a run's CSV.

To ship a new policy: ``her-export RUN_DIR agents/pretrained/<EnvId> --format torch`` (a ``model.pt`` loads in any
install; safetensors is not a dependency), then ``python scripts/measure_pretrained.py <EnvId>``.

    python scripts/measure_pretrained.py                 # every shipped policy
    python scripts/measure_pretrained.py FetchReach-v4 --episodes 100
"""

from __future__ import annotations

import argparse
import json
import sys

from her_agents.pretrained import names, pretrained_dir
from her_agents.run.export import DEFAULT_EPISODES, EVAL_SEED, measure, write_card, write_results
from her_agents.run.policy_file import find_model_file, read_policy_file


def measure_shipped(name: str, episodes: int = DEFAULT_EPISODES, seed: int = EVAL_SEED) -> dict:
    """Measure the shipped policy ``name`` and rewrite its ``results.json`` and card; returns the results."""
    directory = pretrained_dir(name)
    model = find_model_file(directory)
    _, metadata = read_policy_file(model)
    config = json.loads(metadata["config"])
    results = json.loads((directory / "results.json").read_text())
    results.update(measure(model, episodes, seed))
    results.update({"file": model.name, "file_bytes": model.stat().st_size, "dtype": metadata["dtype"]})
    write_results(directory, results)
    write_card(directory, config, results, name=name)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="shipped policies (default: all)")
    parser.add_argument("--episodes", type=int, default=DEFAULT_EPISODES, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=EVAL_SEED, help="eval envs' seed (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    try:
        for name in args.names or names():
            r = measure_shipped(name, args.episodes, args.seed)
            print(f"{name}: success rate {r['success_rate']:.3f} over {r['episodes']} episodes "
                  f"({r['file']} {r['dtype']}, {r['file_bytes'] / 1024:.0f} KiB)")
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Print a per-seed results table (docs/experiments/*.md): eval success of each results/GLOB run (default push_default_s*) at every evaluation.

    python scripts/push_readme_tables.py 'pnp_sac_grasp_s?'
"""

import sys
from pathlib import Path

from her_agents.curves import read_metrics

runs = sorted(Path("results").glob(sys.argv[1] if len(sys.argv) > 1 else "push_default_s*"))
cols = None
for d in runs:
    r = read_metrics(d)
    steps, succ = r["env_steps"].astype(int), r["eval/success_rate"]
    if cols is None:
        cols = steps
        print("| seed | " + " | ".join(f"{s // 1000}k" for s in cols) + " |")
        print("|---|" + "---|" * len(cols))
    vals = {s: v for s, v in zip(steps, succ)}
    print(f"| {d.name[-1]} | " + " | ".join(f"{vals[s]:.2f}" if s in vals else "-" for s in cols) + " |")

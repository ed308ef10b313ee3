"""Launched by torchrun in tests/test_distributed.py: ``her-train`` with per-rank extra overrides.

``HER_TEST_RANK<r>_OVERRIDES="key=value ..."`` adds overrides on rank r only (to launch inconsistent ranks).
"""

import os
import sys

from her_agents.cli import train_main

if __name__ == "__main__":
    args = sys.argv[1:] + os.environ.get(f"HER_TEST_RANK{os.environ.get('RANK', '0')}_OVERRIDES", "").split()
    sys.exit(train_main(args))

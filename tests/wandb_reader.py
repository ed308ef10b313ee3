"""Read back a W&B run file (``run-<id>.wandb``), for tests: see ``agents/wandb_history.py``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from her_agents.wandb_history import final_state, history_rows, read_records, run_files

__all__ = ["final_state", "final_state_once_written", "history_rows", "read_records", "run_files"]


def final_state_once_written(path: str | Path, timeout: float = 60.0) -> tuple[int | None, dict[str, Any]]:
    """:func:`final_state` of a run finished in this process. W&B's service process writes the transaction log
    after ``run.finish`` returns (it flushes at the latest when the process exits), so poll until the exit
    record is there or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        exit_code, summary = final_state(path)
        if exit_code is not None or time.monotonic() > deadline:
            return exit_code, summary
        time.sleep(0.2)

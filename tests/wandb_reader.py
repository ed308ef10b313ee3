"""Read back a W&B run file (``run-<id>.wandb``), for tests: see ``agents/wandb_history.py``."""

from __future__ import annotations

from her_agents.wandb_history import final_state, history_rows, read_records, run_files

__all__ = ["final_state", "history_rows", "read_records", "run_files"]

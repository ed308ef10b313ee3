"""Run logging: one short stdout line per evaluation, ``metrics.csv`` in the run directory, and W&B.

W&B never waits on a login or the network: mode ``auto`` picks ``online`` only when an API key is configured
(``WANDB_API_KEY`` or a netrc entry), else ``offline`` (files under ``<run_dir>/wandb``; upload later with
``wandb sync``). ``WANDB_MODE`` in the environment wins over the config.
"""

from __future__ import annotations

import csv
import math
import netrc
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

__all__ = ["RunLogger", "wandb_mode"]


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(configured: str) -> str:
    """The W&B mode to use: ``WANDB_MODE`` if set, else the config's; ``auto`` -> online/offline by API key."""
    mode = os.environ.get("WANDB_MODE") or configured
    if mode == "auto":
        mode = "online" if _has_api_key() else "offline"
    if mode == "dryrun":
        mode = "offline"
    return mode


class RunLogger:
    """Writes each evaluation row to stdout, ``metrics.csv`` and W&B (``eval/success_rate`` etc.)."""

    def __init__(self, cfg: DictConfig, run_dir: Path, resume_id: str | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.csv_path = self.run_dir / "metrics.csv"
        self._fields: list[str] | None = None
        if self.csv_path.exists():
            with open(self.csv_path) as f:
                header = f.readline().strip()
            self._fields = header.split(",") if header else None
        self.mode = wandb_mode(cfg.log.wandb.mode)
        self.run = None
        if self.mode != "disabled":
            import wandb

            w = cfg.log.wandb
            self.run = wandb.init(
                project=w.project, entity=w.entity, tags=list(w.tags), group=w.group,
                name=w.name or self.run_dir.name, dir=str(self.run_dir), mode=self.mode,
                config=OmegaConf.to_container(cfg, resolve=True), id=resume_id,
                resume="allow" if resume_id else None,
                settings=wandb.Settings(init_timeout=60, silent=True, console="off"),
            )
            self.run.define_metric("env_steps")
            self.run.define_metric("*", step_metric="env_steps")

    @property
    def run_id(self) -> str | None:
        return None if self.run is None else self.run.id

    def progress(self, total: int, initial: int = 0) -> tqdm:
        return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, smoothing=0.05,
                    disable=not self.cfg.log.progress, mininterval=1.0)

    def log(self, row: dict[str, Any], step: int) -> None:
        line = (f"steps {row['env_steps']:>8d} | eval success {row['eval/success_rate']:.3f} | "
                f"train success {row['train/success_rate']:.3f} | updates {row['updates']} | "
                f"{row['env_steps_per_s']:.0f} steps/s | {row['wall_time']:.0f} s")
        tqdm.write(line)
        clean = {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        if self._fields is None or not set(row) <= set(self._fields):
            # New columns (losses appear after the first updates): rewrite the file with the wider header.
            old_rows = []
            if self.csv_path.exists():
                with open(self.csv_path, newline="") as f:
                    old_rows = list(csv.DictReader(f))
            self._fields = list(self._fields or []) + [k for k in row if k not in (self._fields or [])]
            with open(self.csv_path, "w", newline="") as f:
                w = csv.DictWriter(f, self._fields)
                w.writeheader()
                w.writerows(old_rows)
        with open(self.csv_path, "a", newline="") as f:
            csv.DictWriter(f, self._fields, extrasaction="ignore").writerow(clean)
        if self.run is not None:
            self.run.log(row)

    def log_video(self, agent: Any, env_id: str, step: int) -> None:
        """Render one deterministic evaluation episode and log it to W&B; a missing GL backend only warns."""
        if self.run is None:
            return
        try:
            from agents.video import record_episodes

            frames, _ = record_episodes(agent, env_id, n_episodes=1)
            import numpy as np
            import wandb

            self.run.log({"eval/video": wandb.Video(np.transpose(frames, (0, 3, 1, 2)), fps=25, format="mp4"),
                          "env_steps": step})
        except Exception as exc:  # noqa: BLE001 - a video must never stop training
            tqdm.write(f"video skipped: {exc}")

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()

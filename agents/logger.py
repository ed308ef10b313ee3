"""Run logging: one short stdout line per evaluation, ``metrics.csv`` in the run directory, and W&B.

W&B never waits on a login or the network: mode ``auto`` picks ``online`` only when an API key is configured
(``WANDB_API_KEY`` or a netrc entry), else ``offline`` (files under ``<run_dir>/wandb``; upload later with
``wandb sync``). ``WANDB_MODE`` in the environment wins over the config.
"""

from __future__ import annotations

import csv
import io
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

    def __init__(self, cfg: DictConfig, run_dir: Path, resume_id: str | None = None,
                 resume_step: int | None = None) -> None:
        """``resume_step``: the env steps of the checkpoint a resumed run continues from. ``metrics.csv`` keeps
        its rows up to that step and drops the later ones (logged by the killed run after its last checkpoint;
        the resumed run logs those evaluations again), so the file has one row per evaluation, in order.
        ``None`` (a fresh run) starts a new ``metrics.csv``. W&B cannot delete logged rows: a resumed W&B run
        (same id, ``resume="allow"``) may show the evaluations between the checkpoint and the kill twice."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.csv_path = self.run_dir / "metrics.csv"
        self._fields: list[str] | None = None
        self._video_error: str | None = None
        if self.csv_path.exists():
            if resume_step is None:
                self.csv_path.unlink()
            else:
                self._truncate_csv(resume_step)
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

    def _truncate_csv(self, resume_step: int) -> None:
        with open(self.csv_path, newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = reader.fieldnames, list(reader)
        if not fields:
            self.csv_path.unlink()
            return
        self._fields = list(fields)
        # A row cut short by the kill has missing cells (None): drop it too.
        keep = [r for r in rows if None not in r.values() and r.get("env_steps")
                and int(float(r["env_steps"])) <= resume_step]
        if len(keep) < len(rows):
            self._write_csv(keep)

    def _write_csv(self, rows: list[dict[str, Any]]) -> None:
        """Rewrite ``metrics.csv`` (header ``self._fields``) atomically: a kill never loses the old rows."""
        from agents.checkpoint import write_atomic

        text = io.StringIO(newline="")
        w = csv.DictWriter(text, self._fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
        write_atomic(self.csv_path, lambda f: f.write(text.getvalue().encode()))

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
            self._write_csv(old_rows)
        with open(self.csv_path, "a", newline="") as f:
            csv.DictWriter(f, self._fields, extrasaction="ignore").writerow(clean)
        if self.run is not None:
            self.run.log(row)

    def log_video(self, agent: Any, env_id: str, step: int) -> None:
        """Render one deterministic evaluation episode to ``<run_dir>/videos/eval_<step>.mp4`` and log it to W&B.

        A video must never stop training: when rendering fails (no usable ``MUJOCO_GL`` backend), one line
        says why and later evaluations skip the video.
        """
        if self._video_error is not None:
            return
        try:
            from agents.video import record_episodes, write_video

            frames, _ = record_episodes(agent, env_id, n_episodes=1)
            path = self.run_dir / "videos" / f"eval_{step:09d}.mp4"
            write_video(path, frames)  # a file path: wandb.Video on raw arrays would need moviepy
            if self.run is not None:
                import wandb

                self.run.log({"eval/video": wandb.Video(str(path), format="mp4"), "env_steps": step})
        except Exception as exc:
            self._video_error = str(exc)
            tqdm.write(f"video skipped (training goes on, no further videos this run): {exc}")

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()

"""Which W&B mode a run uses: ``WANDB_MODE`` (checked up front, as W&B would refuse it at every init), else
``log.wandb.mode``, ``auto`` meaning online when an API key is configured and offline otherwise; and the removal
of a replaced run's W&B directories."""

from __future__ import annotations

import netrc
import os
import shutil
from pathlib import Path

__all__ = ["WANDB_ENV_MODES", "check_wandb_env", "remove_old_wandb_runs", "wandb_mode"]


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


#: the values W&B itself accepts in ``WANDB_MODE`` (it refuses any other at ``wandb.init``, online or offline)
WANDB_ENV_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def check_wandb_env() -> None:
    """Refuse a ``WANDB_MODE`` that W&B would refuse, up front and in one line: W&B validates it at every
    ``wandb.init`` (``ValidationError: 1 validation error for Settings``), so the online init, then each offline
    retry, would fail and the run would go on without W&B after minutes. An empty ``WANDB_MODE`` means unset:
    it is removed from the environment.

    Raises:
        ValueError: ``WANDB_MODE`` is set to something else than online, offline or disabled (or W&B's
            dryrun, run, shared).
    """
    value = os.environ.get("WANDB_MODE")
    if value is None:
        return
    if not value.strip():
        del os.environ["WANDB_MODE"]
        return
    if value not in WANDB_ENV_MODES:
        raise ValueError(f"WANDB_MODE must be online, offline or disabled (or unset: log.wandb.mode decides), "
                         f"got {value!r}")


def wandb_mode(configured: str) -> str:
    """The W&B mode to use: ``WANDB_MODE`` if set, else the config's; ``auto`` -> online/offline by API key.

    Raises:
        ValueError: a ``WANDB_MODE`` that W&B refuses (``check_wandb_env``).
    """
    check_wandb_env()
    mode = os.environ.get("WANDB_MODE") or configured
    if mode == "run":
        mode = "online"
    if mode == "auto":
        mode = "online" if _has_api_key() else "offline"
    if mode == "dryrun":
        mode = "offline"
    return mode


def remove_old_wandb_runs(wandb_dir: Path) -> None:
    """Remove the W&B run directories (``offline-run-*``, ``run-*``, ``latest-run``) of a run that a fresh run
    replaces in its run directory (``--overwrite``)."""
    if not wandb_dir.is_dir():
        return
    for p in [*wandb_dir.glob("offline-run-*"), *wandb_dir.glob("run-*"), wandb_dir / "latest-run"]:
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p, ignore_errors=True)

"""What both multi-process modes (data-parallel and actor-learner) need at launch: the ranks of torchrun's
rendezvous variables (``rendezvous_env``), and the proof that every rank holds the same resolved config
(``config_digest``, all-gathered; ``config_mismatch_message`` names the ranks and keys that differ). ``state_hash``
fingerprints parameters for the debug dumps the tests compare across ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import torch

from ..config import Config, config_dict
from ..run.run_control import LaunchError, launch_int

__all__ = ["RENDEZVOUS_VARS", "config_digest", "config_mismatch_message", "flat_config", "rendezvous_env",
           "state_hash"]

RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def rendezvous_env() -> dict[str, Any]:
    """``rank``, ``world_size``, ``local_rank`` from the env (1 process without ``WORLD_SIZE``).

    Raises:
        LaunchError: ``WORLD_SIZE > 1`` but a rendezvous variable is missing or malformed.
    """
    world = launch_int("WORLD_SIZE", 1)
    if world <= 1:
        return {"rank": 0, "world_size": 1, "local_rank": 0}
    missing = [k for k in RENDEZVOUS_VARS if not os.environ.get(k)]
    if missing:
        raise LaunchError(
            f"WORLD_SIZE={world} but the rendezvous variable(s) {missing} are not set. Launch with torchrun, "
            "e.g. `torchrun --standalone --nproc_per_node=2 -m her_agents.cli ...` (one machine) or "
            "`torchrun --nnodes=2 --node_rank=N --nproc_per_node=G --rdzv_backend=c10d "
            "--rdzv_endpoint=HOST:PORT -m her_agents.cli ...`, or set all of RANK, WORLD_SIZE, MASTER_ADDR, "
            "MASTER_PORT (or unset WORLD_SIZE for a single process)."
        )
    rank = launch_int("RANK", 0)
    if not 0 <= rank < world:
        raise LaunchError(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    return {"rank": rank, "world_size": world, "local_rank": launch_int("LOCAL_RANK", 0)}


def flat_config(cfg: Config | dict) -> dict[str, Any]:
    """The resolved config (a [`Config`][her_agents.config.Config], or
    [`config_dict`][her_agents.config.config_dict]'s plain data) as ``{"dotted.key": value}``."""
    c = config_dict(cfg) if isinstance(cfg, Config) else cfg
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(c, "")
    return out


def config_digest(cfg: Config) -> str:
    """sha256 of the resolved config (keys sorted)."""
    return hashlib.sha256(json.dumps(flat_config(cfg), sort_keys=True, default=str).encode()).hexdigest()


def state_hash(tensors: list[torch.Tensor | np.ndarray]) -> str:
    """sha256 over the bytes of a list of tensors/arrays (identical values <-> identical hash)."""
    h = hashlib.sha256()
    for t in tensors:
        a = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def config_mismatch_message(flats: list[dict[str, Any]], digests: list[str], what: str = "rank") -> str:
    """Human-readable message naming the ranks (and keys) whose config differs from rank 0's."""
    ref = flats[0]
    parts = []
    for r, (flat, d) in enumerate(zip(flats, digests)):
        if d == digests[0]:
            continue
        keys = sorted(k for k in set(ref) | set(flat) if ref.get(k) != flat.get(k))
        diff = ", ".join(f"{k}: rank 0 {ref.get(k)!r} vs rank {r} {flat.get(k)!r}" for k in keys[:8])
        parts.append(f"{what} {r} ({diff})")
    bad = [r for r, d in enumerate(digests) if d != digests[0]]
    return (f"the ranks were launched with different configs: rank(s) {bad} differ from rank 0: "
            + "; ".join(parts) + ". Launch every rank with the same config file and overrides.")

"""The few collective operations data-parallel training needs, over ``torch.distributed``'s default group.

[`DistContext`][her_agents.dist.distributed.DistContext] talks to the other ranks only through a
``Collective``:
numbers travel as float64 tensors on the group's device (gloo: CPU, nccl: the rank's GPU), Python objects
through pickling. Every call is a collective: all ranks make it, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["Collective"]

T = TypeVar("T")


@dataclass
class Collective:
    """This rank's view of a process group of ``world_size > 1`` ranks (formed by ``init_distributed``)."""

    rank: int
    world_size: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def barrier(self) -> None:
        """Return once every rank has called it."""
        dist.barrier()

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_object(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` in rank order on rank 0; None on the others."""
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Overwrite ``tensor`` (on any device) with rank 0's, in place."""
        buf = tensor.data.to(self.device)
        dist.broadcast(buf, src=0)
        tensor.data.copy_(buf)

    def mean_(self, flat: torch.Tensor) -> None:
        """Replace ``flat`` (on the group's device) by its mean over ranks, in place."""
        dist.all_reduce(flat)
        flat /= self.world_size

    def all_reduce(self, values: Any, op: str = "sum") -> np.ndarray:
        """The element-wise ``"sum"`` or ``"max"`` over ranks of ``values`` (a 1-D sequence of numbers), float64."""
        t = torch.as_tensor(np.asarray(values, dtype=np.float64), device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.cpu().numpy()

    def all_gather(self, values: np.ndarray) -> np.ndarray:
        """Every rank's ``values`` (1-D, the same length everywhere) as rows ``[world_size, len]``, float64."""
        t = torch.as_tensor(np.asarray(values, dtype=np.float64), device=self.device)
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t)
        return torch.stack(out).cpu().numpy()

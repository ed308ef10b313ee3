"""Running mean/std normalizer with the openai/baselines HER semantics.

``normalize(x) = clip((clip(x, -clip_obs, clip_obs) - mean) / std, -clip_range, clip_range)`` with
``std = max(eps, sqrt(var))``. Statistics are kept as float64 running sums (``sum``, ``sumsq``, ``count``) so a
distributed trainer can all-reduce them: compute ``partial_stats(x)`` locally, all-reduce the three arrays, then
``add_stats(...)`` on every worker (``update(x)`` is exactly ``add_stats(*partial_stats(x))``). After changing
``sum``/``sumsq``/``count`` by hand, call ``recompute()``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["RunningNormalizer"]


class RunningNormalizer:
    """Running mean/std normalizer for vectors of ``size`` features.

    Args:
        size: number of features (last dimension of the inputs).
        eps: floor on the standard deviation (baselines ``eps=1e-2``).
        clip_obs: raw inputs are clipped to ``[-clip_obs, clip_obs]`` before statistics and normalization.
        clip_range: normalized outputs are clipped to ``[-clip_range, clip_range]``.
        device: device of the torch copies of ``mean``/``std`` used by ``normalize``.
    """

    def __init__(
        self,
        size: int,
        eps: float = 1e-2,
        clip_obs: float = 200.0,
        clip_range: float = 5.0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.size = int(size)
        self.eps = float(eps)
        self.clip_obs = float(clip_obs)
        self.clip_range = float(clip_range)
        self.device = torch.device(device)
        # float64 running sums: the hook for distributed all-reduce.
        self.sum = np.zeros(self.size, dtype=np.float64)
        self.sumsq = np.zeros(self.size, dtype=np.float64)
        self.count = np.zeros(1, dtype=np.float64)
        self.mean = np.zeros(self.size, dtype=np.float64)
        self.std = np.ones(self.size, dtype=np.float64)
        self._sync_torch()

    # ----------------------------------------------------------------- statistics
    def partial_stats(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sums of ``x`` (any leading shape, last dim ``size``) after raw clipping: ``(sum, sumsq, count)``."""
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.size)
        x = np.clip(x, -self.clip_obs, self.clip_obs)
        return x.sum(axis=0), np.square(x).sum(axis=0), np.array([x.shape[0]], dtype=np.float64)

    def add_stats(self, sum_: np.ndarray, sumsq: np.ndarray, count: np.ndarray | float) -> None:
        """Add (possibly all-reduced) sums to the running statistics and recompute mean/std."""
        self.sum += np.asarray(sum_, dtype=np.float64)
        self.sumsq += np.asarray(sumsq, dtype=np.float64)
        self.count += np.asarray(count, dtype=np.float64).reshape(1)
        self.recompute()

    def update(self, x: np.ndarray) -> None:
        """Add a batch ``x`` of shape ``[N, size]`` (or any ``[..., size]``) to the statistics."""
        if np.size(x) == 0:
            return
        self.add_stats(*self.partial_stats(x))

    def recompute(self) -> None:
        """Recompute ``mean``/``std`` (numpy and torch copies) from ``sum``, ``sumsq``, ``count``."""
        n = float(self.count[0])
        if n > 0:
            self.mean = self.sum / n
            var = np.maximum(self.sumsq / n - np.square(self.mean), 0.0)
            self.std = np.maximum(self.eps, np.sqrt(var))
        else:
            self.mean = np.zeros(self.size, dtype=np.float64)
            self.std = np.ones(self.size, dtype=np.float64)
        self._sync_torch()

    def _sync_torch(self) -> None:
        self.mean_t = torch.as_tensor(self.mean, dtype=torch.float32).to(self.device)
        self.std_t = torch.as_tensor(self.std, dtype=torch.float32).to(self.device)
        # float32 copies for numpy acting: new arrays at every change (an agent caches what it derives from them)
        self.mean32, self.std32 = self.mean.astype(np.float32), self.std.astype(np.float32)

    # ---------------------------------------------------------------- normalizing
    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize a float tensor ``[..., size]`` on ``self.device``; output in ``[-clip_range, clip_range]``."""
        x = x.clamp(-self.clip_obs, self.clip_obs)
        return ((x - self.mean_t) / self.std_t).clamp_(-self.clip_range, self.clip_range)

    def normalize_np(self, x: np.ndarray) -> np.ndarray:
        """Numpy version of ``normalize``, in float32 like it: ``[..., size]`` -> float32 ``[..., size]``."""
        # np.minimum/np.maximum: np.clip has a larger per-call overhead on the one-row arrays of acting
        x = np.maximum(np.asarray(x, dtype=np.float32), -self.clip_obs)
        np.minimum(x, self.clip_obs, out=x)
        x -= self.mean32
        x /= self.std32
        np.maximum(x, -self.clip_range, out=x)
        return np.minimum(x, self.clip_range, out=x)

    def to(self, device: torch.device | str) -> RunningNormalizer:
        self.device = torch.device(device)
        self._sync_torch()
        return self

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Plain numpy/python state (picklable without torch)."""
        return {
            "size": self.size,
            "eps": self.eps,
            "clip_obs": self.clip_obs,
            "clip_range": self.clip_range,
            "sum": self.sum.copy(),
            "sumsq": self.sumsq.copy(),
            "count": self.count.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["size"]) != self.size:
            raise ValueError(f"normalizer size mismatch: checkpoint {state['size']}, this {self.size}")
        self.eps = float(state["eps"])
        self.clip_obs = float(state["clip_obs"])
        self.clip_range = float(state["clip_range"])
        self.sum = np.array(state["sum"], dtype=np.float64)
        self.sumsq = np.array(state["sumsq"], dtype=np.float64)
        self.count = np.array(state["count"], dtype=np.float64).reshape(1)
        self.recompute()

    def __repr__(self) -> str:
        return (
            f"RunningNormalizer(size={self.size}, count={int(self.count[0])}, eps={self.eps}, "
            f"clip_obs={self.clip_obs}, clip_range={self.clip_range})"
        )

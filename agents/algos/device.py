"""Device and precision selection: ``"auto"`` devices, native bf16 detection, ``AgentConfig.precision``."""

from __future__ import annotations

import torch

__all__ = ["native_bf16", "resolve_device", "resolve_precision"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda if available else cpu; anything else is passed to ``torch.device``."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 natively: a CUDA device with bf16 support, or a CPU with AVX512-BF16
    or AMX tiles (torch's own CPU capability checks)."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        cpu = getattr(torch, "cpu", None)
        checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return any(check() for check in checks if check is not None)
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """``AgentConfig.precision`` -> the precision the update runs in: ``"auto"`` is ``"bf16"`` where
    ``native_bf16`` holds for ``device``, else ``"fp32"``; ``"fp32"`` and ``"bf16"`` are returned as given."""
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision

"""Temporally correlated ("colored") exploration noise: Gaussian sequences whose power spectrum falls as
``1 / f^beta`` (Eberhard et al. 2023, "Pink Noise Is All You Need: Colored Noise Exploration in Deep Reinforcement
Learning", ICLR; beta = 0 white, 1 pink, 2 red), drawn with the method of Timmer & Koenig 1995 ("On generating power
law noise", A&A 300, 707), as the ``colorednoise`` package does.

White noise changes sign every other step on average, so a gripper's "close" command rarely lasts the few steps a
grasp needs; pink noise keeps more of its power in slow components and so makes sustained moves likelier while its
per-step variance stays 1.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ColoredNoise", "colored_noise"]


def colored_noise(beta: float, shape: tuple[int, ...], horizon: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian sequences of length ``horizon`` with power spectrum ``~ 1 / f^beta``: float32
    ``[*shape, horizon]``, every step of mean 0 and variance 1 in expectation (Timmer & Koenig 1995, Sec. 3:
    random Fourier coefficients of amplitude ``f^(-beta/2)``, inverse real FFT; frequencies below ``1 / horizon``
    are cut off at it, so the zero-frequency term gives each sequence a random offset). ``beta=0`` is white
    noise.

    Raises:
        ValueError: ``beta`` < 0 or ``horizon`` < 1.
    """
    if beta < 0:
        raise ValueError(f"beta: expected >= 0, got {beta}")
    if horizon < 1:
        raise ValueError(f"horizon: expected >= 1, got {horizon}")
    if horizon == 1:
        return rng.standard_normal((*shape, 1), dtype=np.float32)
    f = np.fft.rfftfreq(horizon)
    scale = np.maximum(f, 1.0 / horizon) ** (-beta / 2.0)
    # the variance of each step of the sequence built below (DC and Nyquist terms real, with twice the
    # variance each), to normalize it to 1
    w2 = 4.0 * scale**2
    w2[0] = 2.0 * scale[0] ** 2
    if horizon % 2 == 0:
        w2[-1] = 2.0 * scale[-1] ** 2
    sigma = np.sqrt(np.sum(w2)) / horizon
    re = rng.standard_normal((*shape, f.size)) * scale
    im = rng.standard_normal((*shape, f.size)) * scale
    if horizon % 2 == 0:  # the Nyquist coefficient of a real signal is real
        im[..., -1] = 0.0
        re[..., -1] *= np.sqrt(2.0)
    im[..., 0] = 0.0  # mean 0 in expectation: the DC coefficient is real too
    re[..., 0] *= np.sqrt(2.0)
    return (np.fft.irfft(re + 1j * im, n=horizon, axis=-1) / sigma).astype(np.float32)


class ColoredNoise:
    """Per-row exploration noise ``[n, dim]`` for an agent acting on ``n`` envs at once: each row follows its own
    ``colored_noise`` sequence of ``horizon`` steps, one step per
    [`sample`][her.buffer.HerReplayBuffer.sample], and draws a new sequence when
    it reaches the end or when [`reset`][her.sb3.HerSB3ReplayBuffer.reset] names it (the training loop does at
    the end of each episode, so that a
    sequence spans one episode, as in Eberhard et al. 2023).

    Args:
        beta: the spectrum's exponent (>= 0; 0 white, 1 pink, 2 red).
        dim: noise dimensions per row (the action's).
        horizon: sequence length in env steps (>= 1): the episode length.
        rng: the generator every sequence is drawn from (the agent's exploration generator).
    """

    def __init__(self, beta: float, dim: int, horizon: int, rng: np.random.Generator) -> None:
        self.beta, self.dim, self.horizon, self.rng = float(beta), int(dim), int(horizon), rng
        self._seq = np.empty((0, self.dim, self.horizon), dtype=np.float32)  # [n, dim, horizon]
        self._pos = np.empty(0, dtype=np.int64)  # [n] the next step of each row's sequence

    def sample(self, n: int) -> np.ndarray:
        """The next noise of ``n`` rows, float32 ``[n, dim]``; a different ``n`` than the last call's starts every
        row afresh."""
        if self._pos.shape[0] != n:
            self._seq = colored_noise(self.beta, (n, self.dim), self.horizon, self.rng)
            self._pos = np.zeros(n, dtype=np.int64)
        spent = self._pos >= self.horizon
        if spent.any():
            self._redraw(spent)
        out = self._seq[np.arange(n), :, self._pos]
        self._pos += 1
        return out

    def reset(self, rows: np.ndarray) -> None:
        """Start a new sequence for the rows where the bool mask ``rows`` (``[n]``) is set (a no-op before the
        first [`sample`][her.buffer.HerReplayBuffer.sample] or for a mask of another length)."""
        rows = np.asarray(rows, dtype=bool).reshape(-1)
        if rows.shape[0] == self._pos.shape[0] and rows.any():
            self._redraw(rows)

    def _redraw(self, rows: np.ndarray) -> None:
        self._seq[rows] = colored_noise(self.beta, (int(rows.sum()), self.dim), self.horizon, self.rng)
        self._pos[rows] = 0

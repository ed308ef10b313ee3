"""TQC for goal-conditioned tasks: SAC with truncated quantile critics (Kuznetsov et al. 2020, "Controlling
Overestimation Bias with Truncated Mixture of Continuous Distributional Quantile Critics", ICML).

Each of ``n_critics`` critics outputs ``n_quantiles`` quantiles of the return distribution ``Z(s, a)``. The target
pools the target critics' atoms at ``(s', a')``, ``a' ~ pi``, sorts them and drops the largest
``top_quantiles_to_drop_per_net * n_critics`` (the paper's truncation, its Eq. 10-11: this is what controls the
overestimation, instead of SAC's min over critics). Every critic regresses its quantiles on the kept atoms with
the quantile Huber loss (Eq. 12-13; Dabney et al. 2018, Eq. 9-10, kappa = 1). The actor maximizes the mean of all
atoms of ``Z(s, pi(s))`` minus the entropy term (Eq. 14); the temperature is SAC's.

This is the Stable-Baselines3 zoo's algorithm for the Fetch tasks (2 critics x 25 quantiles, 2 dropped per
critic, its defaults here).
"""

from __future__ import annotations


import torch

from .base import TensorBatch, clip_q
from .networks import EnsembleCritic
from .configs import TQCConfig
from .sac import SACAgent

__all__ = ["TQCAgent", "TQCConfig", "quantile_huber_loss"]


def quantile_huber_loss(quantiles: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Quantile Huber loss (kappa = 1) of every critic's quantiles against every target atom, summed over critics.

    ``rho_tau(u) = |tau - 1{u < 0}| * huber(u)`` with ``u = target_k - quantile_m`` and ``tau_m = (2m + 1) / 2M``,
    averaged over the ``M`` quantiles and ``K`` atoms of each sample (Dabney et al. 2018, Eq. 10; TQC Eq. 13),
    weighted per sample by ``weight`` (importance sampling), averaged over the batch, summed over the critics.

    Args:
        quantiles: ``[N, B, M]`` float32, the critics' quantiles of ``Z(s, a)``.
        target: ``[B, K]`` float32, the target atoms (no gradient).
        weight: ``[B]`` float32.
    Returns:
        A scalar tensor.
    """
    n_quantiles = quantiles.shape[-1]
    tau = (torch.arange(n_quantiles, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / n_quantiles
    u = target[None, :, None, :] - quantiles[..., None]  # [N, B, M, K]
    abs_u = u.abs()
    huber = torch.where(abs_u <= 1.0, 0.5 * u.square(), abs_u - 0.5)
    rho = (tau[:, None] - (u < 0).to(u.dtype)).abs() * huber
    return (weight * rho.mean(dim=(2, 3))).mean(1).sum()


class TQCAgent(SACAgent):
    """Goal-conditioned TQC. See [`her_agents.algos.base.GoalConditionedAgentBase`][] for the constructor
    arguments; the update returns what [`SACAgent.update`][her_agents.algos.sac.SACAgent.update] returns, with
    ``q_mean`` the mean atom and
    ``td_error`` ``|mean(target atoms) - mean(quantiles)|`` per sample (``[B]``, averaged over the critics)."""

    config: TQCConfig

    def __init__(self, obs_dim: int, goal_dim: int, action_dim: int, config: TQCConfig | None = None,
                 device: str | torch.device = "auto", n_threads: int | None = None) -> None:
        super().__init__(obs_dim, goal_dim, action_dim, config or TQCConfig(), device, n_threads)

    def _build_critic(self) -> EnsembleCritic:
        cfg = self.config
        return EnsembleCritic(self.state_dim, self.action_dim, cfg.hidden, cfg.n_critics, cfg.layer_norm,
                              n_quantiles=cfg.n_quantiles)

    def critic_loss(self, b: TensorBatch, state: torch.Tensor, alpha: torch.Tensor,
                    subset: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Target atoms ``y_k = r + discount * (1 - terminated) * (z_(k)(s', a') - alpha log pi(a'|s'))`` for the
        ``N * (M - d)`` smallest pooled target atoms ``z_(k)``, each clipped to ``q_clip``. ``subset`` is always
        None here (``TQCConfig`` refuses ``target_subset``)."""
        cfg = self.config
        n, m = cfg.n_critics, cfg.n_quantiles
        with torch.no_grad():
            next_state = self.preprocess(b.next_observation, b.desired_goal)
            with self.autocast():
                next_action, next_log_prob = self.actor(next_state)
                next_z = self.critic_target(next_state, next_action)  # [N, B, M] float32
            batch_size = next_z.shape[1]
            pooled = next_z.transpose(0, 1).reshape(batch_size, n * m)
            kept = pooled.sort(dim=1).values[:, : n * (m - cfg.top_quantiles_to_drop_per_net)]  # [B, K]
            bootstrap = (b.discount * (1.0 - b.terminated))[:, None]
            y = clip_q(b.reward[:, None] + bootstrap * (kept - alpha * next_log_prob[:, None]), cfg.q_clip)
        with self.autocast():
            z = self.critic(state, b.action)  # [N, B, M] float32
        assert z.shape == (n, batch_size, m)
        loss = quantile_huber_loss(z, y, b.weight)
        z = z.detach()
        td_error = (y.mean(1) - z.mean(2)).abs().mean(0)
        return loss, loss.detach() / n, z.mean(), td_error

    def _actor_value(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The mean of all critics' quantiles of ``Z(s, a)`` ``[B]`` (not truncated: TQC Eq. 14)."""
        return self.critic(state, action).mean(dim=(0, 2))

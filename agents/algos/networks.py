"""Networks: MLP builder, deterministic tanh actor, squashed Gaussian actor, batched ensemble critic.

All actions live in ``[-1, 1]`` (the env wrapper rescales). Critics take ``(state, action)`` where ``state`` is
the normalized ``concat(observation, goal)``.

Every network returns float32 even when called under ``torch.autocast`` (bf16 matmuls; see
``AgentConfig.precision``): the last layer's output goes through ``full_precision``, so the tanh squashing,
SAC's log-probabilities and everything the agents compute from the outputs stay float32.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DeterministicActor", "EnsembleCritic", "EnsembleLayerNorm", "EnsembleLinear", "Linear",
    "SquashedGaussianActor", "full_precision", "mlp", "reinit_", "tanh_log_det_jacobian",
]

LOG_2 = math.log(2.0)


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """A bf16/fp16 tensor (an autocast matmul's output) -> float32; float32/float64 tensors are returned as is."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose bias is added after the matmul, not inside it.

    ``addmm``/``baddbmm`` on a CPU first copy the bias broadcast to ``[B, out]`` into the output, then run the
    matmul onto it; compiled, that copy is a separate pass per layer (Inductor keeps ``addmm`` whole on a
    CPU). A plain matmul followed by ``+ bias`` lets Inductor fuse the add into the next elementwise kernel
    (LayerNorm, ReLU). Under bf16 autocast the output is float32 (the bias is), as the LayerNorm that follows
    computes anyway."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return y if self.bias is None else y + self.bias


def mlp(
    in_dim: int,
    out_dim: int,
    hidden: Sequence[int] = (256, 256, 256),
    layer_norm: bool = False,
    activation: type[nn.Module] = nn.ReLU,
) -> nn.Sequential:
    """``Linear -> [LayerNorm] -> activation`` per hidden layer, then a final ``Linear`` to ``out_dim``
    (``Linear`` layers)."""
    layers: list[nn.Module] = []
    last = in_dim
    for h in hidden:
        layers.append(Linear(last, h))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(activation(inplace=True) if activation is nn.ReLU else activation())
        last = h
    layers.append(Linear(last, out_dim))
    return nn.Sequential(*layers)


class DeterministicActor(nn.Module):
    """``a = tanh(mlp(state))``: ``[B, state_dim] -> [B, action_dim]`` in ``[-1, 1]``."""

    def __init__(
        self, state_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256, 256), layer_norm: bool = False
    ) -> None:
        super().__init__()
        self.net = mlp(state_dim, action_dim, hidden, layer_norm)

    @property
    def head(self) -> nn.Module:
        """The output layer (what ``agent.reset_layers: last`` re-initializes)."""
        return self.net[-1]

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.tanh(full_precision(self.net(state)))


def tanh_log_det_jacobian(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)^2)`` in the numerically stable form ``2 * (log 2 - u - softplus(-2u))``."""
    return 2.0 * (LOG_2 - u - F.softplus(-2.0 * u))


class SquashedGaussianActor(nn.Module):
    """SAC policy: ``a = tanh(u)``, ``u ~ N(mu(s), std(s))``; ``log_std`` clamped to ``[log_std_min, log_std_max]``.

    ``forward(state, deterministic, noise=None)`` returns ``(action [B, A], log_prob [B])``, the standard normal
    sample ``noise [B, A]`` drawn with ``randn`` unless given; with ``deterministic=True`` the action is
    ``tanh(mu)`` and ``log_prob`` is that of the mean (rarely useful).
    """

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        hidden: Sequence[int] = (256, 256, 256),
        layer_norm: bool = False,
        log_std_min: float = -20.0,
        log_std_max: float = 2.0,
    ) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.net = mlp(state_dim, 2 * action_dim, hidden, layer_norm)
        self.log_std_min = float(log_std_min)
        self.log_std_max = float(log_std_max)

    @property
    def head(self) -> nn.Module:
        """The output layer of mean and log std (what ``agent.reset_layers: last`` re-initializes)."""
        return self.net[-1]

    def distribution_params(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_std = full_precision(self.net(state)).chunk(2, dim=-1)
        return mu, log_std.clamp(self.log_std_min, self.log_std_max)

    def forward(self, state: torch.Tensor, deterministic: bool = False, noise: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_std = self.distribution_params(state)
        if deterministic:
            noise = torch.zeros_like(mu)
        elif noise is None:
            noise = torch.randn_like(mu)
        u = mu + noise * log_std.exp()
        # Normal log-density of u written with the standard noise ((u - mu) / std == noise).
        log_prob = (-0.5 * noise.square() - log_std - 0.5 * math.log(2.0 * math.pi)).sum(-1)
        log_prob = log_prob - tanh_log_det_jacobian(u).sum(-1)
        return torch.tanh(u), log_prob

    @staticmethod
    def log_prob_of_pre_tanh(mu: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``log pi(tanh(u))`` for given pre-tanh ``u``: ``[B, A] -> [B]``."""
        z = (u - mu) / log_std.exp()
        log_prob = (-0.5 * z.square() - log_std - 0.5 * math.log(2.0 * math.pi)).sum(-1)
        return log_prob - tanh_log_det_jacobian(u).sum(-1)


class _EnsembleMatmul(torch.autograd.Function):
    """``x [n, B, in] @ weight[n, out, in]^T -> [n, B, out]``, with the weight's gradient computed as
    ``grad^T @ x`` so it comes out in the weight's own ``[n, out, in]`` layout. (``bmm``'s generic backward
    gives ``x^T @ grad``, ``[n, in, out]``, and the optimizer step then reads it transposed.) Under autocast the
    operands are cast to the autocast dtype here, as ``bmm`` would be, and saved in it for the backward."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            return torch.bmm(x, weight.transpose(1, 2))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight = inputs
        ctx.param_dtypes = (x.dtype, weight.dtype)
        if output.dtype != weight.dtype:  # the operands as the forward multiplied them
            x, weight = x.to(output.dtype), weight.to(output.dtype)
        ctx.save_for_backward(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.to(weight.dtype)
        grad_x = torch.bmm(grad, weight).to(ctx.param_dtypes[0]) if ctx.needs_input_grad[0] else None
        grad_w = torch.bmm(grad.transpose(1, 2), x).to(ctx.param_dtypes[1]) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


class EnsembleLinear(nn.Module):
    """``n`` independent linear layers as one batched matmul: weight ``[n, out, in]`` (``nn.Linear`` layout per
    member), bias ``[n, 1, out]``.

    ``forward(x)``: input ``[B, in]`` (shared by all members) or ``[n, B, in]``, output ``[n, B, out]``.
    ``forward(x, member=i)``: member ``i`` alone as a plain linear layer, ``[B, in] -> [B, out]``.
    ``forward(x, members=idx)``: the ``m`` members of the int64 tensor ``idx [m]``, ``[B or m, B, in] -> [m, B,
    out]``. Each member is initialized like ``nn.Linear`` (uniform in ``+-1/sqrt(in)``).
    """

    def __init__(self, n: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.n, self.in_features, self.out_features = n, in_features, out_features
        self.weight = nn.Parameter(torch.empty(n, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(n, 1, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, member: int | None = None, members: torch.Tensor | None = None
                ) -> torch.Tensor:
        if member is not None:
            # the bias added after the matmul, as in ``Linear``
            if self.n == 1:  # a view, whose backward is a view too (a select's backward fills a zero tensor)
                return F.linear(x, self.weight.view(self.out_features, self.in_features)) + self.bias.view(-1)
            return F.linear(x, self.weight[member]) + self.bias[member, 0]
        w: torch.Tensor = self.weight
        b: torch.Tensor = self.bias
        if members is not None:
            w, b = w.index_select(0, members), b.index_select(0, members)
        if x.dim() == 2:
            x = x.expand(w.shape[0], *x.shape)
        return _EnsembleMatmul.apply(x, w) + b

    def extra_repr(self) -> str:
        return f"n={self.n}, in_features={self.in_features}, out_features={self.out_features}"


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dim with a separate affine per member: input ``[n, B, d]``, ``[B, d]`` for
    ``member=i`` alone, ``[m, B, d]`` for the members of the int64 tensor ``members [m]``."""

    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.d = d
        self.weight = nn.Parameter(torch.ones(n, 1, d))
        self.bias = nn.Parameter(torch.zeros(n, 1, d))

    def forward(self, x: torch.Tensor, member: int | None = None, members: torch.Tensor | None = None
                ) -> torch.Tensor:
        if member is not None:
            return F.layer_norm(x, (self.d,), self.weight[member, 0], self.bias[member, 0])
        if members is not None:
            weight, bias = self.weight.index_select(0, members), self.bias.index_select(0, members)
            return F.layer_norm(x, (self.d,)) * weight + bias
        return F.layer_norm(x, (self.d,)) * self.weight + self.bias


class EnsembleCritic(nn.Module):
    """``n_critics`` Q-networks evaluated in one pass: ``(state [B, S], action [B, A]) -> Q [n_critics, B]``.

    ``member=i`` evaluates only critic ``i`` (output ``[1, B]``), e.g. TD3's actor loss on ``Q_1``;
    ``members=idx`` (int64 ``[m]``) only the critics ``idx`` (output ``[m, B]``), e.g. REDQ's random subset
    (``agent.target_subset``).
    ``n_quantiles`` given (TQC): each critic outputs that many quantiles of the return, ``[n_critics, B,
    n_quantiles]`` (``[1, B, n_quantiles]`` for ``member=i``), also for one quantile.
    """

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        hidden: Sequence[int] = (256, 256, 256),
        n_critics: int = 2,
        layer_norm: bool = False,
        n_quantiles: int | None = None,
    ) -> None:
        super().__init__()
        self.n_critics, self.n_quantiles = n_critics, n_quantiles
        dims = [state_dim + action_dim, *hidden]
        self.linears = nn.ModuleList(EnsembleLinear(n_critics, i, o) for i, o in itertools.pairwise(dims))
        self.norms = nn.ModuleList(EnsembleLayerNorm(n_critics, o) for o in hidden) if layer_norm else None
        self.head = EnsembleLinear(n_critics, dims[-1], n_quantiles or 1)

    def forward(self, state: torch.Tensor, action: torch.Tensor, member: int | None = None,
                members: torch.Tensor | None = None) -> torch.Tensor:
        if member is None and members is None and self.n_critics == 1:
            member = 0  # one critic: plain 2-D layers, faster than a batched matmul of one
        elif member is not None and not 0 <= member < self.n_critics:
            raise IndexError(f"member must be in [0, {self.n_critics}), got {member}")
        h = torch.cat([state, action], dim=-1)
        for i, linear in enumerate(self.linears):
            h = linear(h, member, members)
            if self.norms is not None:
                h = self.norms[i](h, member, members)
            # in place (the matmul's backward needs its inputs, not this output) and never on a view: autograd
            # handles an in-place op on a view with a copy of the whole base
            h = h.relu_()
        q = full_precision(self.head(h, member, members))
        if self.n_quantiles is None:
            q = q.squeeze(-1)
        return q if member is None else q.unsqueeze(0)


def reinit_(modules: Iterable[nn.Module], generator: torch.Generator) -> list[nn.Parameter]:
    """Draw the parameters of every layer in ``modules`` afresh, in place, from the distributions their
    constructors use: a ``Linear``'s or ``EnsembleLinear``'s weight and bias uniform in ``+-1/sqrt(in_features)``
    (``nn.Linear``'s ``kaiming_uniform_(a=sqrt(5))`` is that bound too), a LayerNorm's weight 1 and bias 0. The
    draws come from ``generator`` (a CPU generator) and are copied onto the parameters' device, so that views of
    the parameters (the numpy actor) and optimizers' references stay valid.

    Returns:
        The parameters drawn afresh.
    Raises:
        TypeError: a module with parameters of another kind of layer (no silent half reset).
    """
    done: list[nn.Parameter] = []
    with torch.no_grad():
        for module in modules:
            for layer in module.modules():
                own = list(layer.parameters(recurse=False))
                if not own:
                    continue
                if isinstance(layer, (nn.Linear, EnsembleLinear)):
                    bound = 1.0 / math.sqrt(layer.in_features)
                    for p in own:
                        p.copy_(torch.empty(p.shape, dtype=p.dtype).uniform_(-bound, bound, generator=generator))
                elif isinstance(layer, (nn.LayerNorm, EnsembleLayerNorm)):
                    layer.weight.fill_(1.0)
                    layer.bias.zero_()
                else:
                    raise TypeError(f"reinit_ knows Linear and LayerNorm layers, got {type(layer).__name__}")
                done.extend(own)
    return done

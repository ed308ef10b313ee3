"""A/B of the network layers in one process: the compiled bf16 update with the layers as they were (A) against
the current ones (B), timed alternately so that a shared machine's slow spells hit both alike.

    python tests/benchmarks/bench_layers_ab.py [--algos ddpg td3 sac] [--rounds 6] [--batch-size 256]

A puts back, on the agent's own modules, the layers before the change: the bias inside the matmul
(``F.linear`` with bias, i.e. ``addmm``; ``torch.baddbmm`` in the ensemble critics, whose CPU kernels first copy the
broadcast bias into the output) and ``bmm``'s generic backward for the ensemble weights (their gradient comes out
transposed, ``[n, in, out]``). B is :class:`her_agents.algos.networks.Linear` and
:class:`~her_agents.algos.networks.EnsembleLinear` as they are. Same parameters, same maths; one line per algorithm
and variant with min and median ms over the rounds (each the best of 5 repeats of 20 updates) and their ratios to
the FLOP floor of ``bench_update.py``, measured in the same process.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from bench_update import ACT, GOAL, HIDDEN, OBS, ab_line, ab_setup, ab_times, flop_floor, host
from her_agents.algos import networks
from her_agents.algos.registry import make_agent


class _BiasInMatmulEnsembleLinear(networks.EnsembleLinear):
    """The ensemble layer before the change (A): bias inside ``baddbmm``/``F.linear``, generic ``bmm`` backward."""

    def forward(self, x: torch.Tensor, member: int | None = None) -> torch.Tensor:
        if member is not None:
            weight = self.weight.view(self.out_features, self.in_features) if self.n == 1 else self.weight[member]
            return F.linear(x, weight, self.bias.view(-1) if self.n == 1 else self.bias[member, 0])
        x = x.expand(self.n, *x.shape) if x.dim() == 2 else x
        return torch.baddbmm(self.bias, x, self.weight.transpose(1, 2))


def use_old_layers(agent) -> None:
    """Switch every layer of ``agent``'s networks to the A variant in place (the parameters stay the same)."""
    for net in agent.networks().values():
        for module in net.modules():
            if type(module) is networks.EnsembleLinear:
                module.__class__ = _BiasInMatmulEnsembleLinear
            elif type(module) is networks.Linear:
                module.__class__ = nn.Linear


def main() -> None:
    args, batch = ab_setup(__doc__)
    for algo in args.algos:
        agents = {}
        for variant in ("A", "B"):
            agent = make_agent(algo, OBS, GOAL, ACT, precision="bf16", layer_norm=True, compile=True)
            if variant == "A":
                use_old_layers(agent)
            agent.update_normalizer(*host(batch.observation, batch.desired_goal))
            agents[variant] = agent
        floor_ms, _ = flop_floor(algo, batch, "bf16", HIDDEN, True, 20)
        times = ab_times(agents, batch, args.rounds)
        for variant, label in (("A", "bias in matmul"), ("B", "bias after matmul")):
            print(f"{algo} bf16 compiled B={args.batch_size} {variant} ({label}): {ab_line(times[variant], floor_ms)}",
                  flush=True)

if __name__ == "__main__":
    main()

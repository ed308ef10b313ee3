"""Time one agent update per algorithm against a straightforward reference torch update.

    python tests/benchmarks/bench_update.py [--batch-sizes 256 1024] [--iters 20] [--threads 1]
        [--precision fp32 bf16] [--hidden 256 256 256] [--layer-norm] [--compile] [--device cpu|cuda]

FetchPush sizes (obs 25, goal 3, action 4) and MLPs of ``--hidden`` sizes (3x256 by default); ``--layer-norm``
gives the agents LayerNorm networks (``agent.layer_norm``, as the Fetch configs use; the reference has none). The reference is what one writes first: separate
``nn.Sequential`` critics (two for TD3/SAC, one for DDPG), plain ``torch.optim.Adam``, critic gradients
computed during the actor step, one ``.item()`` per metric. ``--compile`` additionally times each precision with
``agent.compile=true`` (the agents' loss functions through ``torch.compile``; "failed" where it falls back to eager).
``--precision`` lists the agent precisions (``AgentConfig.precision``) to time, one column each (default both
fp32 and bf16; the reference is fp32). ``speedup`` is reference ms / first precision's ms;
a ``<p> speedup`` column per further precision is first precision's ms / ``<p>``'s ms.

After the table, one line per algorithm, precision, mode and batch size gives the update's ratio to its FLOP floor:
the matmuls of the update (forward and backward, shapes and dtype recorded from an eager update) timed as plain
``torch.mm``/``torch.bmm`` calls, ``<algo> <precision> <mode> B=<n>: <ms> ms, <r>x the FLOP floor``.

``--device cuda`` puts the agents, the reference and the batches (as device tensors) on the GPU, and the FLOP
floor's operands too; each timing is bracketed by ``torch.cuda.synchronize()``. There ``--compile`` is the agents'
CUDA-graph path (``torch.compile(mode="reduce-overhead")``, see ``her_agents.algos.compiled.CompiledOrEager``).
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from her_agents.algos.networks import mlp
from her_agents.algos.registry import make_agent

OBS, GOAL, ACT = 25, 3, 4
HIDDEN = (256, 256, 256)


def make_batch(batch_size: int, seed: int = 0, device: str = "cpu") -> SimpleNamespace:
    """A FetchPush-sized batch: numpy arrays for ``"cpu"``, tensors on ``device`` otherwise (as a GPU replay
    would hand them over; ``terminated`` stays bool, the agents and the reference convert it). ``"cpu:0"`` gives
    CPU tensors, which the tests use to run the device code path without a GPU."""
    rng = np.random.default_rng(seed)
    batch = SimpleNamespace(
        observation=rng.normal(size=(batch_size, OBS)).astype(np.float32),
        desired_goal=rng.normal(size=(batch_size, GOAL)).astype(np.float32),
        action=rng.uniform(-1, 1, (batch_size, ACT)).astype(np.float32),
        reward=-(rng.random(batch_size) < 0.5).astype(np.float32),
        next_observation=rng.normal(size=(batch_size, OBS)).astype(np.float32),
        discount=np.full(batch_size, 0.98, np.float32),
        terminated=np.zeros(batch_size, bool),
        weight=np.ones(batch_size, np.float32),
    )
    if device != "cpu":
        batch = SimpleNamespace(**{k: torch.as_tensor(v, device=device) for k, v in vars(batch).items()})
    return batch


def host(*arrays) -> list[np.ndarray]:
    """numpy copies of a batch's arrays or tensors (the normalizers take numpy)."""
    return [a.cpu().numpy() if isinstance(a, torch.Tensor) else a for a in arrays]


def synchronize(device: str) -> None:
    """Wait for the device's queued kernels (a no-op on the CPU), so a wall-clock time covers their work."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class ReferenceAgent:
    """Straightforward DDPG/TD3/SAC update with separate critics and plain Adam (same maths as the agents)."""

    def __init__(self, algo: str, hidden: tuple[int, ...] = HIDDEN, device: str = "cpu") -> None:
        self.algo = algo
        s = OBS + GOAL
        n_critics = 1 if algo == "ddpg" else 2
        self.actor = mlp(s, 2 * ACT if algo == "sac" else ACT, hidden).to(device)
        self.critics = [mlp(s + ACT, 1, hidden).to(device) for _ in range(n_critics)]
        self.actor_target = copy.deepcopy(self.actor)
        self.critic_targets = [copy.deepcopy(c) for c in self.critics]
        self.actor_optim = torch.optim.Adam(self.actor.parameters(), lr=1e-3)
        self.critic_optim = torch.optim.Adam([p for c in self.critics for p in c.parameters()], lr=1e-3)
        self.log_alpha = torch.zeros(1, device=device, requires_grad=True)
        self.alpha_optim = torch.optim.Adam([self.log_alpha], lr=1e-3)
        self.mean, self.std = torch.zeros(s, device=device), torch.ones(s, device=device)
        self.n = 0

    def sample(self, state):
        mu, log_std = self.actor(state).chunk(2, -1)
        log_std = log_std.clamp(-20, 2)
        dist = torch.distributions.Normal(mu, log_std.exp())
        u = dist.rsample()
        a = torch.tanh(u)
        log_prob = dist.log_prob(u).sum(-1) - torch.log(1 - a.pow(2) + 1e-6).sum(-1)
        return a, log_prob

    def update(self, batch) -> dict:
        o = torch.as_tensor(batch.observation)
        g = torch.as_tensor(batch.desired_goal)
        o2 = torch.as_tensor(batch.next_observation)
        a = torch.as_tensor(batch.action)
        r = torch.as_tensor(batch.reward).unsqueeze(1)
        d = torch.as_tensor(batch.discount).unsqueeze(1)
        term = torch.as_tensor(batch.terminated).float().unsqueeze(1)
        w = torch.as_tensor(batch.weight).unsqueeze(1)
        s = ((torch.cat([o, g], 1) - self.mean) / self.std).clamp(-5, 5)
        s2 = ((torch.cat([o2, g], 1) - self.mean) / self.std).clamp(-5, 5)
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            if self.algo == "sac":
                a2, logp2 = self.sample(s2)
                q2 = torch.min(*[c(torch.cat([s2, a2], 1)) for c in self.critic_targets])
                q2 = q2 - alpha * logp2.unsqueeze(1)
            else:
                a2 = torch.tanh(self.actor_target(s2))
                if self.algo == "td3":
                    a2 = (a2 + (torch.randn_like(a2) * 0.2).clamp(-0.5, 0.5)).clamp(-1, 1)
                qs = [c(torch.cat([s2, a2], 1)) for c in self.critic_targets]
                q2 = qs[0] if len(qs) == 1 else torch.min(qs[0], qs[1])
            y = (r + d * (1 - term) * q2).clamp(-50, 0)
        qs = [c(torch.cat([s, a], 1)) for c in self.critics]
        critic_loss = sum((w * (q - y) ** 2).mean() for q in qs)
        self.critic_optim.zero_grad()
        critic_loss.backward()
        self.critic_optim.step()
        self.n += 1
        out = {"critic_loss": critic_loss.item(), "q_mean": qs[0].mean().item()}
        if self.algo != "td3" or self.n % 2 == 0:
            if self.algo == "sac":
                pi, logp = self.sample(s)
                q_pi = torch.min(*[c(torch.cat([s, pi], 1)) for c in self.critics])
                actor_loss = (alpha * logp.unsqueeze(1) - q_pi).mean()
            else:
                pi = torch.tanh(self.actor(s))
                actor_loss = -self.critics[0](torch.cat([s, pi], 1)).mean() + (pi**2).mean()
            self.actor_optim.zero_grad()
            actor_loss.backward()
            self.actor_optim.step()
            out["actor_loss"] = actor_loss.item()
            if self.algo == "sac":
                alpha_loss = -(self.log_alpha * (logp.detach() - ACT)).mean()
                self.alpha_optim.zero_grad()
                alpha_loss.backward()
                self.alpha_optim.step()
                out["alpha"] = self.log_alpha.exp().item()
            with torch.no_grad():
                pairs = [(self.actor_target, self.actor)] if self.algo != "sac" else []
                pairs += list(zip(self.critic_targets, self.critics))
                for tgt, src in pairs:
                    for pt, ps in zip(tgt.parameters(), src.parameters()):
                        pt.mul_(0.95).add_(0.05 * ps)
        out["td_error"] = (y - qs[0]).abs().squeeze(1).detach().cpu().numpy()
        return out


def time_updates(agent, batch, iters: int, warmup: int, repeats: int = 5, device: str = "cpu") -> float:
    """Best-of-``repeats`` ms per update (each repeat: ``iters`` updates) after ``warmup`` updates."""
    for _ in range(warmup):
        agent.update(batch)
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            agent.update(batch)
        synchronize(device)
        times.append((time.perf_counter() - t0) / iters * 1e3)
    return float(np.min(times))




def ab_setup(doc: str) -> tuple[argparse.Namespace, SimpleNamespace]:
    """The A/B scripts' command line (``--algos``, ``--rounds``, ``--batch-size``; ``doc`` as its help), one torch
    thread, and the batch: ``(args, batch)``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", choices=["ddpg", "td3", "sac"], default=["ddpg", "td3", "sac"])
    parser.add_argument("--rounds", type=int, default=6, help="alternating timing rounds (A B, then B A, ...)")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    return args, make_batch(args.batch_size)

def ab_times(agents: dict, batch, rounds: int) -> dict[str, np.ndarray]:
    """ms per update of agents ``{"A": ..., "B": ...}`` timed alternately (A B, then B A, ...) for ``rounds`` rounds,
    each :func:`time_updates` of 20 updates after 5 of warm-up: one array of ``rounds`` timings per variant."""
    times: dict[str, list[float]] = {v: [] for v in agents}
    order = list(agents)
    for r in range(rounds):
        for variant in order if r % 2 == 0 else order[::-1]:
            times[variant].append(time_updates(agents[variant], batch, 20, 5))
    return {v: np.array(t) for v, t in times.items()}


def ab_line(t: np.ndarray, floor_ms: float) -> str:
    """``min <ms> ms, median <ms> ms; <r>x / <r>x the FLOP floor (<ms> ms)`` for one variant's timings ``t``."""
    return (f"min {t.min():.2f} ms, median {np.median(t):.2f} ms; {t.min() / floor_ms:.2f}x / "
            f"{np.median(t) / floor_ms:.2f}x the FLOP floor ({floor_ms:.2f} ms)")

class MatmulRecorder(TorchDispatchMode):
    """Records the operand shapes and dtype of every matmul (``mm``, ``addmm``, ``bmm``, ``baddbmm``) that
    reaches the kernels, forward and backward: what the update's FLOPs are made of."""

    OPERANDS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...], tuple[int, ...], torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.OPERANDS:
            i, j = self.OPERANDS[name]
            self.calls.append((name, tuple(args[i].shape), tuple(args[j].shape), args[i].dtype))
        return func(*args, **(kwargs or {}))


def matmul_flops(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """``2 m n k`` (times the batch of a ``bmm``) for ``a [.., m, k] @ b [.., k, n]``."""
    return 2 * int(np.prod(a)) * b[-1]


def flop_floor(algo: str, batch, precision: str, hidden, layer_norm: bool, iters: int,
               device: str = "cpu") -> tuple[float, float]:
    """``(ms, GFLOP)`` per update of the FLOP floor: the matmuls of two eager updates (TD3's actor runs every
    second one), recorded with their shapes and dtype, then timed as plain ``torch.mm``/``torch.bmm`` calls on
    random operands of the same shapes and dtype on ``device`` (best of 5, synchronized), divided by two."""
    agent = make_agent(algo, OBS, GOAL, ACT, device=device, precision=precision, hidden=list(hidden),
                       layer_norm=layer_norm)
    agent.update_normalizer(*host(batch.observation, batch.desired_goal))
    agent.update(batch)
    with MatmulRecorder() as rec:
        agent.update(batch)
        agent.update(batch)
    ops = [(torch.bmm if len(a) == 3 else torch.mm, torch.randn(a, device=device).to(dt),
            torch.randn(b, device=device).to(dt)) for _, a, b, dt in rec.calls]
    gflop = sum(matmul_flops(a.shape, b.shape) for _, a, b in ops) / 2 / 1e9
    for fn, a, b in ops:  # warm-up
        fn(a, b)
    times = []
    for _ in range(5):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            for fn, a, b in ops:
                fn(a, b)
        synchronize(device)
        times.append((time.perf_counter() - t0) / iters / 2 * 1e3)
    return float(np.min(times)), gflop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", choices=["ddpg", "td3", "sac"], default=["ddpg", "td3", "sac"],
                        help="algorithms with a reference update here")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--iters", type=int, default=20, help="updates per timing repeat (best of 5 repeats)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="agent precisions to time (one 'agent ms' column each)")
    parser.add_argument("--hidden", nargs="+", type=int, default=list(HIDDEN), help="hidden layer sizes")
    parser.add_argument("--layer-norm", action="store_true", help="LayerNorm in the agents' networks")
    parser.add_argument("--compile", action="store_true",
                        help="also time each precision with agent.compile=true (compiled loss functions)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the agents, the reference, the batches and the FLOP floor's matmuls run")
    args = parser.parse_args()
    hidden = tuple(args.hidden)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, device {where}, threads {torch.get_num_threads()}, obs {OBS} goal {GOAL} "
          f"act {ACT}, hidden {hidden}, layer_norm {args.layer_norm}")
    header = f"{'algo':<6}{'batch':>7}{'reference ms':>14}"
    header += "".join(f"{f'{p} ms':>10}" for p in args.precision) + f"{'speedup':>9}"
    if len(args.precision) > 1:
        header += "".join(f"{f'{p} speedup':>14}" for p in args.precision[1:])
    if args.compile:
        header += "".join(f"{f'{p} compiled ms':>20}" for p in args.precision)
    print(header)
    print("-" * len(header))
    measured: list[tuple[str, str, str, int, float]] = []  # algo, precision, mode, batch, ms
    for algo in args.algos:
        for bs in args.batch_sizes:
            batch = make_batch(bs, device=device)
            ref_ms = time_updates(ReferenceAgent(algo, hidden, device), batch, args.iters, args.warmup,
                                  device=device)
            ms = []
            for precision in args.precision:
                agent = make_agent(algo, OBS, GOAL, ACT, device=device, precision=precision, hidden=list(hidden),
                                   layer_norm=args.layer_norm)
                agent.update_normalizer(*host(batch.observation, batch.desired_goal))
                ms.append(time_updates(agent, batch, args.iters, args.warmup, device=device))
                measured.append((algo, precision, "eager", bs, ms[-1]))
            line = f"{algo:<6}{bs:>7}{ref_ms:>14.2f}" + "".join(f"{m:>10.2f}" for m in ms)
            line += f"{ref_ms / ms[0]:>8.2f}x" + "".join(f"{ms[0] / m:>13.2f}x" for m in ms[1:])
            if args.compile:
                for precision in args.precision:
                    agent = make_agent(algo, OBS, GOAL, ACT, device=device, precision=precision, hidden=list(hidden),
                                       layer_norm=args.layer_norm, compile=True)
                    agent.update_normalizer(*host(batch.observation, batch.desired_goal))
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always", RuntimeWarning)
                        c_ms = time_updates(agent, batch, args.iters, args.warmup + 5, device=device)
                    # the agent's fallback warning only: Inductor warns too on CUDA (e.g. TF32 left off)
                    failed = [w for w in caught if "agent.compile" in str(w.message)]
                    line += f"{'failed' if failed else f'{c_ms:.2f}':>20}"
                    if not failed:
                        measured.append((algo, precision, "compiled", bs, c_ms))
                    for w in failed:
                        print(w.message)
            print(line, flush=True)
    print("\nFLOP floor: each update's matmuls (forward and backward, recorded from the eager update) timed as plain "
          "matmuls of the same shapes and precision")
    floors: dict[tuple[str, str, int], tuple[float, float]] = {}
    for algo, precision, mode, bs, ms in measured:
        key = (algo, precision, bs)
        if key not in floors:
            floors[key] = flop_floor(algo, make_batch(bs, device=device), precision, hidden, args.layer_norm,
                                     args.iters, device=device)
        floor_ms, gflop = floors[key]
        print(f"{algo} {precision} {mode} B={bs}: {ms:.2f} ms, {ms / floor_ms:.2f}x the FLOP floor "
              f"({floor_ms:.2f} ms: {gflop:.3f} GFLOP at {gflop / floor_ms * 1e3:.0f} GFLOP/s)", flush=True)


if __name__ == "__main__":
    main()

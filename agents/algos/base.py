"""The ``Agent`` protocol (what the loop, the data-parallel wrapper and the actor-learner use of an agent), and
the goal-conditioned pieces DDPG/TD3/SAC/TQC share.

Shared pieces (openai/baselines HER techniques):
- observation and goal ``RunningNormalizer`` (clip raw +-200, output +-5); the networks' input is
  ``concat(normalize(observation), normalize(goal))``
  ([`GoalConditionedAgentBase.preprocess`][her_agents.algos.base.GoalConditionedAgentBase.preprocess]);
- batch -> tensors
  ([`GoalConditionedAgentBase.batch_to_tensors`][her_agents.algos.base.GoalConditionedAgentBase.batch_to_tensors]),
  target-Q clipping (``clip_q``);
- exploration in [`GoalConditionedAgentBase.act`][her_agents.algos.base.GoalConditionedAgentBase.act]:
  Gaussian noise ``noise_std`` clipped to ``[-1, 1]``,
  then per row with probability ``random_eps`` a uniform random action;
- polyak averaging
  ([`GoalConditionedAgentBase.update_targets`][her_agents.algos.base.GoalConditionedAgentBase.update_targets]),
  fused Adam (``make_adam``), device and thread selection;
- optional bf16 mixed precision of the network forward passes in ``update``
  ([`GoalConditionedAgentBase.autocast`][her_agents.algos.base.GoalConditionedAgentBase.autocast]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
import warnings
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from .configs import PRECISIONS, AgentConfig
from .noise import ColoredNoise
from .normalizer import RunningNormalizer

__all__ = [
    "PRECISIONS", "Agent", "AgentConfig", "CompiledOrEager", "GoalConditionedAgentBase", "TensorBatch",
    "clip_q", "freeze", "make_adam", "native_bf16", "q_clip_for_env", "resolve_device",
    "resolve_precision", "td_target", "td_target_bounds",
]

@runtime_checkable
class Agent(Protocol):
    """What the training loop (``her_agents.loop.train``), the data-parallel wrapper (``her_agents.distributed.data_parallel``) and
    the actor-learner (``her_agents.distributed.actor_learner``) use of an agent; nothing else is read across modules.

    [`GoalConditionedAgentBase`][her_agents.algos.base.GoalConditionedAgentBase] implements it for DDPG, TD3,
    SAC and TQC.
    """

    @property
    def obs_normalizer(self) -> RunningNormalizer:
        """Running statistics of the observations (the data-parallel wrapper merges them across ranks)."""
        ...

    @property
    def goal_normalizer(self) -> RunningNormalizer:
        """Running statistics of the goals."""
        ...

    @property
    def rng(self) -> np.random.Generator:
        """The exploration noise's generator (each data-parallel rank saves its own in a checkpoint)."""
        ...

    @property
    def num_updates(self) -> int:
        """Gradient updates done so far."""
        ...

    def act(self, observation: np.ndarray, desired_goal: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """``[N, obs_dim], [N, goal_dim] -> [N, action_dim]`` float32 actions in ``[-1, 1]``."""
        ...

    def reset_noise(self, done: np.ndarray) -> None:
        """The envs of bool mask ``done [N]`` (``act``'s rows) start new episodes: temporally correlated
        exploration noise starts afresh for them."""
        ...

    def value(self, observation: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        """``[N, obs_dim], [N, goal_dim] -> [N]`` float32: the critic's value of the deterministic policy's action."""
        ...

    def update(self, batch: Any) -> dict[str, float | np.ndarray]:
        """One gradient step on a batch; returns scalar metrics and ``td_error`` ``[B]`` float32."""
        ...

    def update_normalizer(self, observation: np.ndarray, desired_goal: np.ndarray) -> None:
        """Add observations ``[..., obs_dim]`` and goals ``[..., goal_dim]`` to the running statistics."""
        ...

    def networks(self) -> dict[str, nn.Module]:
        """Every network (online and target) by name; their parameters and buffers are the agent's weights."""
        ...

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer by name (the data-parallel wrapper averages gradients before each step)."""
        ...

    def policy_state_dict(self) -> dict[str, Any]:
        """What acting needs (the policy network and the normalizers), as CPU copies an actor can load."""
        ...

    def load_policy_state_dict(self, state: dict[str, Any]) -> None:
        """Load [`policy_state_dict`][her_agents.algos.base.Agent.policy_state_dict] (of an agent of the same
        configuration)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything to resume: networks, optimizers, normalizers, counters, config, exploration RNG."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load [`state_dict`][her_agents.algos.base.Agent.state_dict]."""
        ...


class TensorBatch(NamedTuple):
    """A batch on the agent's device: float32 tensors, ``[B, ...]``; ``terminated`` as 0/1 float."""

    observation: torch.Tensor
    desired_goal: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_observation: torch.Tensor
    discount: torch.Tensor
    terminated: torch.Tensor
    weight: torch.Tensor


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


def make_adam(params: Iterable[nn.Parameter] | Iterable[torch.Tensor], lr: float) -> torch.optim.Adam:
    """Adam with the fused kernel where available (CPU and CUDA in recent torch), else foreach."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


def clip_q(y: torch.Tensor, q_clip: tuple[float, float] | None) -> torch.Tensor:
    """Clip a TD target to ``q_clip`` (no-op when None)."""
    if q_clip is None:
        return y
    return y.clamp(q_clip[0], q_clip[1])


def td_target_bounds(reward_range: tuple[float, float] | None, gamma: float) -> tuple[float, float] | None:
    """Bounds of every discounted return ``sum_{j<m} gamma^j r_j`` (``1 <= m <= inf``) for rewards in
    ``reward_range = (r_min, r_max)``, so of Q and of every TD target that bootstraps from a bounded Q.

    ``low = r_min / (1 - gamma)`` if ``r_min < 0`` else ``r_min``; ``high = r_max / (1 - gamma)`` if
    ``r_max > 0`` else ``r_max`` (an infinite side where gamma is 1 or the reward unbounded). -1/0 rewards give
    ``[-1/(1-gamma), 0]``, 0/1 rewards ``[0, 1/(1-gamma)]``. Returns None when ``reward_range`` is None or both
    sides are infinite; finite bounds are rounded to float32 (the TD targets' dtype).
    """
    if reward_range is None:
        return None
    r_min, r_max = (float(v) for v in reward_range)
    scale = np.inf if gamma >= 1.0 else 1.0 / (1.0 - float(gamma))

    def bound(r: float, outward: bool) -> float:
        b = r * scale if outward and r != 0 else r
        return float(np.float32(b)) if np.isfinite(b) else b

    low, high = bound(r_min, r_min < 0), bound(r_max, r_max > 0)
    if not (np.isfinite(low) or np.isfinite(high)):
        return None
    return low, high


_UNSET = object()


def q_clip_for_env(reward_range: tuple[float, float] | None, gamma: float, env_id: str,
                   configured: Any = _UNSET) -> tuple[float, float] | None:
    """The TD-target clip for an env: ``configured`` (``agent.q_clip``) when given, else
    ``td_target_bounds`` of the env's ``reward_range``.

    Args:
        reward_range: ``GoalEnvSpec.reward_range`` (``(low, high)``, a side may be infinite, or None).
        gamma: the discount.
        env_id: named in the error message.
        configured: ``[low, high]``, or None (no clip); omitted: derive from ``reward_range``.

    Raises:
        ValueError: ``configured`` excludes a reward the env can give (a finite side of ``reward_range``
            outside ``[low, high]``): such a clip would hold Q away from the values it must learn.
    """
    derived = td_target_bounds(reward_range, gamma)
    if configured is _UNSET:
        return derived
    if configured is None:
        return None
    low, high = (float(v) for v in configured)
    if reward_range is not None:
        r_min, r_max = (float(v) for v in reward_range)
        if (np.isfinite(r_min) and r_min < low) or (np.isfinite(r_max) and r_max > high):
            hint = f"[{derived[0]}, {derived[1]}]" if derived is not None else "null"
            raise ValueError(
                f"agent.q_clip must contain the rewards of {env_id} (reward range [{r_min}, {r_max}]), "
                f"got [{low}, {high}]; use {hint} (the bound for gamma {gamma}), or leave agent.q_clip unset to "
                "derive it from the env"
            )
    return low, high


def td_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    q_clip: tuple[float, float] | None,
) -> torch.Tensor:
    """``y = clip(r + discount * (1 - terminated) * next_q)``, every input and the output shaped ``[B]``."""
    assert reward.dim() == 1 and reward.shape == discount.shape == terminated.shape == next_q.shape, (
        f"TD target shapes must all be [B]: reward {tuple(reward.shape)}, discount {tuple(discount.shape)}, "
        f"terminated {tuple(terminated.shape)}, next_q {tuple(next_q.shape)}"
    )
    return clip_q(reward + discount * (1.0 - terminated) * next_q, q_clip)


class CompiledOrEager:
    """``torch.compile(fn)``, falling back to ``fn`` for good when the first call fails to compile (no C++ compiler,
    an unsupported backend). The functions of one agent share ``failed`` (a one-item list): the first failure warns
    once (a ``RuntimeWarning`` naming the function and the error) and the others then run eagerly without trying.
    An error that ``fn`` raises eagerly too is raised as usual.

    ``mode``: ``torch.compile``'s mode, None (the default mode) unless given. On a CUDA device the agent passes
    ``"reduce-overhead"``
    ([`GoalConditionedAgentBase.compile_mode`][her_agents.algos.base.GoalConditionedAgentBase.compile_mode]):
    Inductor's kernels are recorded once
    into CUDA graphs (CUDAGraph Trees) and replayed, forward and backward, so an update launches a few graphs
    instead of hundreds of small kernels. The shapes are static (``dynamic=False``: one batch size per run).

    ``trace_autograd``: trace ``torch.autograd.grad`` calls into the graph (Dynamo's ``trace_autograd_ops``)
    instead of breaking it there; the whole-update functions
    ([`GoalConditionedAgentBase.whole_update`][her_agents.algos.base.GoalConditionedAgentBase.whole_update])
    need it.
    Those also skip Dynamo's guard checks once compiled (``set_stance(skip_guard_eval_unsafe=True)``: only the
    guards that tell the compiled variants apart run), about 0.3 ms of a 6-10 ms update on a CPU. That is safe here
    because every tensor the update reads (parameters, optimizer state, normalizer statistics, the batch) is fetched
    anew at each call and keeps its shape and dtype, and the settings it reads are fixed at construction; a call
    that needs a new variant leaves the stance and compiles it (tests/test_agents.py checks a reloaded state).

    ``cpp_wrapper``: Inductor's C++ wrapper (``options={"cpp_wrapper": True}``): the code that calls the kernels is
    compiled C++ instead of Python, which takes the per-kernel call overhead out of every update (the whole-update
    functions on a CPU; ``tests/benchmarks/bench_cpp_wrapper_ab.py`` measures it) for a longer first compile.
    Where it fails to compile, the function is compiled once more without it before falling back to eager.
    """

    def __init__(self, fn, name: str, failed: list[bool], mode: str | None = None,
                 trace_autograd: bool = False, cpp_wrapper: bool = False) -> None:
        self.fn, self.name, self.failed, self.compiled_ok, self.mode = fn, name, failed, None, mode
        self.skip_guards, self.trace_autograd = trace_autograd, trace_autograd
        self.cpp_wrapper = cpp_wrapper
        self._compiled = self._build(cpp_wrapper)

    def _build(self, cpp_wrapper: bool):
        # the CPU path passes exactly dynamic=False, as before CUDA graphs were added
        kwargs = {"mode": self.mode} if self.mode else {}
        if cpp_wrapper:
            kwargs["options"] = {"cpp_wrapper": True}
        compiled = torch.compile(self.fn, dynamic=False, **kwargs)
        # the fast path (compiled variants only, guards skipped) calls it without the config patch, which costs
        # about 10 us a call and matters only while tracing
        self._unpatched = compiled
        if self.trace_autograd:  # the setting is read while tracing, i.e. inside the call
            compiled = torch._dynamo.config.patch(trace_autograd_ops=True)(compiled)
        return compiled

    def __call__(self, *args, **kwargs):
        if self.compiled_ok:
            if self.skip_guards:
                try:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        return self._unpatched(*args, **kwargs)
                except RuntimeError as exc:  # a variant not compiled yet (TD3's step without the actor): compile it
                    if "skip_guard_eval_unsafe" not in str(exc):
                        raise
            return self._compiled(*args, **kwargs)
        if self.compiled_ok is False or self.failed[0]:
            self.compiled_ok = False
            return self.fn(*args, **kwargs)
        try:
            try:
                out = self._compiled(*args, **kwargs)
            except Exception:
                if not self.cpp_wrapper:
                    raise
                # the C++ wrapper needs more of the toolchain (Python headers) than Inductor's kernels: without it
                self.cpp_wrapper, self._compiled = False, self._build(False)
                out = self._compiled(*args, **kwargs)
        except Exception as exc:  # any compiler failure; fn itself runs below
            self.compiled_ok, self.failed[0] = False, True
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            warnings.warn(f"agent.compile: torch.compile of {self.name} failed, the update runs eagerly "
                          f"({type(exc).__name__}: {first})", RuntimeWarning, stacklevel=2)
            return self.fn(*args, **kwargs)
        self.compiled_ok = True
        return out


def freeze(params: nn.Module | Iterable[torch.Tensor], frozen: bool) -> None:
    """Turn ``requires_grad`` off (``frozen=True``) or back on for a module's parameters (or a list of them:
    listing a module's parameters walks its submodules, which is slow in a hot loop)."""
    for p in params.parameters() if isinstance(params, nn.Module) else params:
        p.requires_grad_(not frozen)


class GoalConditionedAgentBase:
    """Normalizers, preprocessing, batch conversion, exploration and checkpointing shared by the agents.

    Subclasses build their networks (the policy network as ``self.actor``), implement ``_policy`` and
    [`update`][her_agents.algos.base.Agent.update], and list everything a checkpoint needs in
    ``_checkpoint_items``.

    Args:
        obs_dim: size of ``observation``.
        goal_dim: size of ``desired_goal``.
        action_dim: size of the action.
        config: the algorithm's config dataclass.
        device: ``"auto"`` (cuda if available), ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        n_threads: if given, ``torch.set_num_threads(n_threads)`` at construction.
    """

    config: AgentConfig
    actor: nn.Module

    def __init__(
        self,
        obs_dim: int,
        goal_dim: int,
        action_dim: int,
        config: AgentConfig,
        device: str | torch.device = "auto",
        n_threads: int | None = None,
    ) -> None:
        if n_threads is not None:
            torch.set_num_threads(int(n_threads))
        self.obs_dim, self.goal_dim, self.action_dim = int(obs_dim), int(goal_dim), int(action_dim)
        self.state_dim = self.obs_dim + self.goal_dim
        self.config = config
        self.device = resolve_device(device)
        self.precision = resolve_precision(config.precision, self.device)
        """The precision ``update()`` runs in: ``config.precision`` with ``"auto"`` resolved for the device."""
        norm_kw = {"eps": config.norm_eps, "clip_obs": config.norm_clip_obs, "clip_range": config.norm_clip_range}
        self.obs_normalizer = RunningNormalizer(self.obs_dim, device=self.device, **norm_kw)
        self.goal_normalizer = RunningNormalizer(self.goal_dim, device=self.device, **norm_kw)
        self.rng = np.random.default_rng(config.seed)
        self.num_updates = 0

    # ------------------------------------------------------------------ inputs
    def preprocess(self, observation: torch.Tensor, desired_goal: torch.Tensor) -> torch.Tensor:
        """``concat(normalize(observation), normalize(goal))``: ``[B, obs_dim], [B, goal_dim] -> [B, state_dim]``."""
        return torch.cat(
            [self.obs_normalizer.normalize(observation), self.goal_normalizer.normalize(desired_goal)], dim=-1
        )

    def _tensor(self, x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=dtype, non_blocking=True)
        if (type(x) is np.ndarray and x.dtype == np.float32 and dtype == torch.float32 and x.flags.writeable
                and self.device.type == "cpu"):
            return torch.from_numpy(x)  # shares the memory: a few us less than as_tensor in every update
        return torch.as_tensor(np.asarray(x), dtype=dtype, device=self.device)

    def batch_to_tensors(self, batch: Any) -> TensorBatch:
        """Attributes (or mapping keys) of ``batch`` -> ``TensorBatch`` on the device.

        numpy arrays and torch tensors are both accepted; a missing ``weight`` means ones. Every ``update()``
        starts here, so this also marks the start of an update for CUDA graphs (``_cuda_graph_step``).
        """
        self._cuda_graph_step()
        get = batch.get if isinstance(batch, Mapping) else lambda k: getattr(batch, k, None)
        reward = self._tensor(get("reward")).reshape(-1)
        weight = get("weight")
        return TensorBatch(
            observation=self._tensor(get("observation")),
            desired_goal=self._tensor(get("desired_goal")),
            action=self._tensor(get("action")),
            reward=reward,
            next_observation=self._tensor(get("next_observation")),
            discount=self._tensor(get("discount")).reshape(-1),
            terminated=self._tensor(get("terminated")).reshape(-1),
            weight=torch.ones_like(reward) if weight is None else self._tensor(weight).reshape(-1),
        )

    def update_normalizer(self, observation: np.ndarray, desired_goal: np.ndarray) -> None:
        """Add ``observation [..., obs_dim]`` and ``desired_goal [..., goal_dim]`` to the normalizers."""
        self.obs_normalizer.update(observation)
        self.goal_normalizer.update(desired_goal)

    # ------------------------------------------------------------------ acting
    def _policy(self, state: torch.Tensor, deterministic: bool, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The policy's action ``[N, action_dim]`` in ``[-1, 1]`` for preprocessed ``state`` (no grad); a stochastic
        policy (``stochastic_policy``) draws its standard normal sample from ``noise [N, action_dim]`` when
        given."""
        raise NotImplementedError

    #: the policy samples its own exploration (SAC, TQC): colored noise (``noise_beta``) drives that sample
    #: rather than the ``noise_std`` noise added in
    # [`explore`][her_agents.algos.base.GoalConditionedAgentBase.explore]
    stochastic_policy: bool = False

    def act(self, observation: np.ndarray, desired_goal: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions ``[N, action_dim]`` float32 in ``[-1, 1]`` (a single unbatched row is also accepted).

        With ``deterministic=False``: Gaussian noise ``noise_std`` is added and clipped to ``[-1, 1]``, then
        each row is replaced by a uniform random action with probability ``random_eps``. With ``noise_beta > 0``
        the Gaussian draws are row ``i``'s next step of a colored sequence (``ColoredNoise``; for SAC/TQC,
        the policy's own sample), so row ``i`` must be the same env at every call.

        On the CPU the policy runs in numpy on views of the actor's parameters
        (``her_agents.algos.networks.numpy_mlp``; faster for the few rows of acting, same function); elsewhere
        in torch, with the networks in eval mode.
        """
        single = np.ndim(observation) == 1
        policy = self._numpy_policy()
        noise = None if deterministic or self.config.noise_beta == 0 else self._colored_noise(
            int(np.prod(np.shape(observation)[:-1])))
        policy_noise = noise if self.stochastic_policy else None
        if policy is not None:
            observation, desired_goal = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x
                                         for x in (observation, desired_goal))
            state = np.concatenate([np.reshape(observation, (-1, self.obs_dim)),
                                    np.reshape(desired_goal, (-1, self.goal_dim))], axis=1, dtype=np.float32)
            action = policy(self._normalize_state_np(state), deterministic, self.rng, policy_noise)
        else:
            obs_t = self._tensor(observation).reshape(-1, self.obs_dim)
            goal_t = self._tensor(desired_goal).reshape(-1, self.goal_dim)
            self.set_training(False)
            with torch.no_grad():
                action = self._policy(self.preprocess(obs_t, goal_t), deterministic,
                                      None if policy_noise is None else self._tensor(policy_noise))
            action = action.cpu().numpy()
        action = action.astype(np.float32, copy=False)
        if not deterministic:
            action = self.explore(action, None if self.stochastic_policy else noise)
        return action[0] if single else action

    def value(self, observation: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
        """``V(s, g) = Q(s, mu(s, g), g)`` float32 ``[N]`` for ``observation [N, obs_dim]`` and ``desired_goal
        [N, goal_dim]``: the value the actor maximizes (``_actor_value``) at the policy's deterministic action
        (SAC: the mean action), no grad. Used to judge which goals the agent can reach (``her.MinDensityGoals``)."""
        obs_t = self._tensor(observation).reshape(-1, self.obs_dim)
        goal_t = self._tensor(desired_goal).reshape(-1, self.goal_dim)
        self.set_training(False)
        with torch.no_grad():
            state = self.preprocess(obs_t, goal_t)
            with self.autocast():
                v = self._actor_value(state, self._policy(state, True))
        return v.float().cpu().numpy()

    def _actor_value(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The critic's value ``[B]`` that the actor's loss maximizes."""
        raise NotImplementedError

    def _colored_noise(self, n: int) -> np.ndarray:
        """The next colored noise ``[n, action_dim]`` (``ColoredNoise`` on
        [`rng`][her_agents.algos.base.Agent.rng], ``noise_beta > 0``)."""
        source = self.__dict__.get("_noise_source")
        if source is None or source.rng is not self.rng:
            source = self._noise_source = ColoredNoise(self.config.noise_beta, self.action_dim,
                                                       self.config.noise_horizon, self.rng)
        return source.sample(n)

    def reset_noise(self, done: np.ndarray) -> None:
        """Start a new colored noise sequence (``noise_beta > 0``) for the envs whose episode ended: ``done``, bool
        ``[n_envs]``, in the rows' order of [`act`][her_agents.algos.base.GoalConditionedAgentBase.act]. A
        no-op with white noise."""
        source = self.__dict__.get("_noise_source")
        if source is not None:
            source.reset(done)

    def _normalize_state_np(self, state: np.ndarray) -> np.ndarray:
        """[`preprocess`][her_agents.algos.base.GoalConditionedAgentBase.preprocess] in numpy, in place on
        ``state = concat(observation, goal)`` float32 ``[N, S]``: one
        pass with both normalizers' statistics side by side (the calls, not the arithmetic, cost here)."""
        mean, std, obs_low, obs_high, low, high = self._state_stats_np()
        np.maximum(state, obs_low, out=state)
        np.minimum(state, obs_high, out=state)
        state -= mean
        state /= std
        np.maximum(state, low, out=state)
        return np.minimum(state, high, out=state)

    def _state_stats_np(self) -> tuple[np.ndarray, ...]:
        """Mean, std and clip bounds of observation and goal side by side, float32 ``[S]`` each; cached until a
        normalizer's statistics (new arrays on every change) or clip settings change."""
        on, gn = self.obs_normalizer, self.goal_normalizer
        arrays = (on.mean32, on.std32, gn.mean32, gn.std32)
        clips = (on.clip_obs, gn.clip_obs, on.clip_range, gn.clip_range)
        cached = self.__dict__.get("_state_stats")
        if cached is not None and all(a is b for a, b in zip(cached[0], arrays)) and cached[1] == clips:
            return cached[2]

        def joined(obs_part: Any, goal_part: Any) -> np.ndarray:
            return np.concatenate([np.broadcast_to(obs_part, self.obs_dim),
                                   np.broadcast_to(goal_part, self.goal_dim)]).astype(np.float32)

        clip_obs, clip_range = joined(on.clip_obs, gn.clip_obs), joined(on.clip_range, gn.clip_range)
        stats = (joined(on.mean32, gn.mean32), joined(on.std32, gn.std32), -clip_obs, clip_obs, -clip_range,
                 clip_range)
        self._state_stats = (arrays, clips, stats)
        return stats

    #: per-instance caches of parameter views and lists: rebuilt on demand, never pickled or deep-copied
    _CACHES = ("_numpy_policy_cache", "_state_stats", "_polyak_params", "_param_lists", "_compiled_fns",
               "_compile_failed", "_noise_source")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._CACHES}

    def _numpy_policy(self):
        """The actor's ``numpy_policy()`` on the CPU (built once: it holds views of the parameters); None on
        other devices or for an actor numpy cannot mirror (a layer ``her_agents.algos.networks.numpy_mlp``
        does not
        know): ``act()`` then runs torch."""
        if self.device.type != "cpu" or not hasattr(self, "actor"):
            return None
        cached = self.__dict__.get("_numpy_policy_cache")
        if cached is None or cached[0] is not self.actor:
            try:
                policy = self.actor.numpy_policy()
            except (AttributeError, TypeError):
                policy = None
            cached = self._numpy_policy_cache = (self.actor, policy)
        return cached[1]

    def explore(self, action: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """Gaussian noise ``noise_std * z`` (clipped to ``[-1, 1]``; ``z`` standard normal, ``noise`` where given)
        plus per-row uniform random actions with prob ``random_eps``."""
        cfg = self.config
        n = action.shape[0]
        if cfg.noise_std > 0:
            z = self.rng.standard_normal(action.shape, dtype=np.float32) if noise is None else noise
            action = action + cfg.noise_std * z
            np.maximum(action, -1.0, out=action)  # in place: np.clip allocates and is slower on one row
            np.minimum(action, 1.0, out=action)
        if cfg.random_eps > 0:
            rows = self.rng.random(n) < cfg.random_eps
            if rows.any():
                action = action.copy() if not action.flags.writeable else action
                action[rows] = self.rng.uniform(-1.0, 1.0, size=(int(rows.sum()), self.action_dim))
        return action.astype(np.float32, copy=False)

    def loss_fn(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (a bound loss method of this agent, called from ``update()``), wrapped in ``torch.compile`` when
        ``config.compile`` is set (see ``CompiledOrEager``; mode
        [`compile_mode`][her_agents.algos.base.GoalConditionedAgentBase.compile_mode]), else as is. The
        compiled function is built once per method and reused."""
        if not self.config.compile:
            return fn
        name = fn.__name__
        fns = self.__dict__.setdefault("_compiled_fns", {})
        if name not in fns:
            failed = self.__dict__.setdefault("_compile_failed", [False])  # shared by this agent's functions
            fns[name] = CompiledOrEager(fn, f"{type(self).__name__}.{name}", failed, mode=self.compile_mode())
        return fns[name]

    # ------------------------------------------------------------------ the whole update as one graph
    def compiles_whole_update(self) -> bool:
        """Whether ``update()`` runs as one compiled graph
        ([`whole_update`][her_agents.algos.base.GoalConditionedAgentBase.whole_update]): ``config.compile`` on
        a CPU
        device, ``whole_update_ok`` set, and every optimizer a one-group Adam without weight decay, amsgrad
        or maximize (the step the graph applies). Elsewhere the loss functions alone are compiled
        ([`loss_fn`][her_agents.algos.base.GoalConditionedAgentBase.loss_fn]), as on a CUDA device, where CUDA
        graphs already remove the launch overhead."""
        if not (self.config.compile and self.whole_update_ok and self.device.type == "cpu"):
            return False
        return all(len(o.param_groups) == 1 and not o.param_groups[0]["weight_decay"]
                   and not o.param_groups[0]["amsgrad"] and not o.param_groups[0]["maximize"]
                   for o in self.optimizers().values())

    #: set False by code that must see every ``optimizer.step()`` (the data-parallel gradient averaging hooks
    #: the optimizers' step): the update then compiles its loss functions only
    whole_update_ok: bool = True

    #: compile the whole update with Inductor's C++ wrapper on a CPU (``CompiledOrEager``); read once, at the
    #: first update (``tests/benchmarks/bench_cpp_wrapper_ab.py`` sets it False on its A agents)
    cpp_wrapper: bool = True

    def whole_update(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (a bound method computing one whole update: losses, ``torch.autograd.grad``,
        [`adam_step_`][her_agents.algos.base.GoalConditionedAgentBase.adam_step_] and target updates) through
        ``torch.compile`` as one graph, so that one call replaces
        the losses' forward and backward graphs, the optimizers' steps and the polyak update with their Python
        and dispatch overhead (``CompiledOrEager`` with ``trace_autograd``; eager where compiling fails).
        Built once per method."""
        name = "whole:" + fn.__name__
        fns = self.__dict__.setdefault("_compiled_fns", {})
        if name not in fns:
            failed = self.__dict__.setdefault("_compile_failed", [False])
            fns[name] = CompiledOrEager(fn, f"{type(self).__name__}.{fn.__name__}", failed, trace_autograd=True,
                                        cpp_wrapper=self.cpp_wrapper and self.device.type == "cpu")
        return fns[name]

    def adam_scalars(self, *optims: torch.optim.Optimizer) -> torch.Tensor:
        """``[lr / (1 - beta1^t), sqrt(1 - beta2^t)]`` per optimizer for its next step ``t``, float32 ``[2 *
        len(optims)]`` on the device: Adam's bias corrections, computed here so the compiled update takes them as
        an input (a Python float would be a constant of the graph and recompile it every step). Creates the
        optimizers' state (``step``, ``exp_avg``, ``exp_avg_sq``, as ``torch.optim.Adam`` does at its first step)
        where it does not exist yet."""
        values = []
        for optim in optims:
            group = optim.param_groups[0]
            if not optim.state[group["params"][0]]:  # created for all parameters at once, here or by torch
                for p in group["params"]:
                    optim.state[p].update(step=torch.zeros((), dtype=torch.float32, device=p.device),
                                          exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                                          exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))
            t = int(optim.state[group["params"][0]]["step"]) + 1
            beta1, beta2 = group["betas"]
            values += [group["lr"] / (1.0 - beta1**t), math.sqrt(1.0 - beta2**t)]
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    @staticmethod
    def adam_step_(optim: torch.optim.Optimizer, loss: torch.Tensor, scalars: torch.Tensor) -> None:
        """One Adam step (Kingma & Ba 2015, Algorithm 1, in ``torch.optim.Adam``'s form) of ``optim``'s parameters
        on ``d loss / d params``, written to the parameters and ``optim.state`` in place, for use inside
        [`whole_update`][her_agents.algos.base.GoalConditionedAgentBase.whole_update]: ``m <- lerp(m, g, 1 -
        beta1)``, ``v <- beta2 v + (1 - beta2) g^2``, ``p <- p -
        scalars[0] * m / (sqrt(v) / scalars[1] + eps)`` with ``scalars`` the optimizer's pair from
        [`adam_scalars`][her_agents.algos.base.GoalConditionedAgentBase.adam_scalars]. The state stays
        ``torch.optim.Adam``'s, so checkpoints are unchanged."""
        group = optim.param_groups[0]
        params = group["params"]
        beta1, beta2 = group["betas"]
        eps = group["eps"]
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                state = optim.state[p]
                state["step"].add_(1.0)
                state["exp_avg"].lerp_(g, 1.0 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                p.sub_(scalars[0] * state["exp_avg"] / (state["exp_avg_sq"].sqrt() / scalars[1] + eps))

    def compile_mode(self) -> str | None:
        """``torch.compile``'s mode for the loss functions: ``"reduce-overhead"`` (CUDA graphs) on a CUDA device,
        None (the default mode, as before) elsewhere."""
        return "reduce-overhead" if self.device.type == "cuda" else None

    def _cuda_graph_step(self) -> None:
        """Called at the start of every update (from
        [`batch_to_tensors`][her_agents.algos.base.GoalConditionedAgentBase.batch_to_tensors]): with CUDA
        graphs (compiled loss
        functions on a CUDA device) tell CUDAGraph Trees that a new update begins.

        Without it, CUDAGraph Trees starts a new "generation" at every compiled call made with no backward
        pending, i.e. at the actor loss, right after the critic's ``backward()``: the replay would then reuse the
        memory of the critic loss's outputs (``q``, ``td_error``) that ``_metrics`` reads afterwards. Once
        ``torch.compiler.cudagraph_mark_step_begin`` has been called, generations change only where it is
        called: all compiled calls of one update share one generation, and outputs are overwritten by the next
        update's replays. So a tensor kept across updates must be a clone (TD3's ``_last_actor_loss``);
        ``_metrics`` copies everything else to the host within the update, and ``zero_grad(set_to_none=True)``
        drops the gradients (graph outputs too) before each backward."""
        if self.config.compile and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()

    def _critic_regression(self, b: TensorBatch, state: torch.Tensor, y: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The critics' regression onto the TD target ``y [B]``: ``(loss, Q [n_critics, B] detached, td_error [B])``
        with ``loss = sum_i mean_b(weight_b * (Q_i(s_b, a_b) - y_b)^2)`` (the importance-sampling weights of
        prioritized replay, Schaul et al. 2016, Eq. 1-2, as ``weight``) and ``td_error = mean_i |y - Q_i|``."""
        with self.autocast():
            q = self.critic(state, b.action)  # [n_critics, B] float32
        assert q.dim() == 2 and q.shape[1] == y.shape[0], f"critic output {tuple(q.shape)}, target {tuple(y.shape)}"
        loss = (b.weight * (q - y).square()).mean(1).sum()
        q = q.detach()
        return loss, q, (y - q).abs().mean(0)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the network forward passes in ``update()``: bf16 autocast on the agent's device when
        [`precision`][her_agents.algos.base.GoalConditionedAgentBase.precision] (``config.precision`` resolved
        for the device) is ``"bf16"``, else a no-op.

        Wrap forward passes only (not ``backward`` or optimizer steps): autocast caches the bf16 copies of the
        parameters until the context exits, so a context spanning an optimizer step would reuse stale copies.
        """
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ targets / metrics
    def update_targets(self) -> None:
        """Polyak-average every (target, online) pair in ``_target_pairs`` (one foreach call for all)."""
        targets, online = self.polyak_params()
        with torch.no_grad():
            torch._foreach_lerp_(targets, online, 1.0 - self.config.polyak)

    def polyak_params(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(target parameters, online parameters)`` of ``_target_pairs``, listed once (parameters are
        updated in place); [`whole_update`][her_agents.algos.base.GoalConditionedAgentBase.whole_update]
        callers list them before the compiled call."""
        if "_polyak_params" not in self.__dict__:
            pairs = self._target_pairs()
            self._polyak_params = ([p for t, _ in pairs for p in t.parameters()],
                                   [p for _, o in pairs for p in o.parameters()])
        return self._polyak_params

    def params(self, module: nn.Module) -> list[nn.Parameter]:
        """``list(module.parameters())``, listed once per module (for ``freeze`` in every update)."""
        cache = self.__dict__.setdefault("_param_lists", {})
        if id(module) not in cache:
            cache[id(module)] = (module, list(module.parameters()))  # the module kept: its id stays unique
        return cache[id(module)][1]

    def _target_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        raise NotImplementedError

    @staticmethod
    def _flat_metrics(scalars: list[torch.Tensor], td_error: torch.Tensor) -> torch.Tensor:
        """``[len(scalars) + B]`` float32: the scalar metrics, then ``td_error``, detached (built inside a compiled
        update, so that ``_metrics_from_flat`` reads them with one host copy and no extra kernels)."""
        return torch.cat([torch.stack([s.detach().float() for s in scalars]), td_error.detach().float()])

    @staticmethod
    def _metrics_from_flat(names: tuple[str, ...], flat: torch.Tensor) -> dict[str, float | np.ndarray]:
        """``_flat_metrics``' tensor -> ``{name: float}`` and ``td_error`` ``[B]`` float32 (a copy)."""
        host = flat.cpu().numpy()
        out: dict[str, float | np.ndarray] = {k: float(v) for k, v in zip(names, host[: len(names)].tolist())}
        out["td_error"] = host[len(names) :].copy()
        return out

    def _metrics(self, scalars: dict[str, torch.Tensor], td_error: torch.Tensor) -> dict[str, float | np.ndarray]:
        """One device->host copy for all metrics: scalar tensors -> floats, ``td_error [B]`` -> float32 array."""
        return self._metrics_from_flat(tuple(scalars), self._flat_metrics(list(scalars.values()), td_error))

    # ------------------------------------------------------------------ train / eval mode
    def set_training(self, training: bool) -> None:
        """Put the online networks in train (``update``) or eval (acting) mode, as ``nn.Module.train`` does, so
        layers such as dropout or batch norm behave as they should in each; target networks stay in eval mode.
        A no-op when the mode does not change."""
        if self.__dict__.get("_training") is training:
            return
        for name, item in self._checkpoint_items().items():
            if isinstance(item, nn.Module):
                item.train(training and "target" not in name)
        self._training = training

    # ------------------------------------------------------------------ checkpoint
    def _checkpoint_items(self) -> dict[str, Any]:
        """Name -> object with ``state_dict``/``load_state_dict`` (modules, optimizers, normalizers)."""
        raise NotImplementedError

    def networks(self) -> dict[str, nn.Module]:
        """Every network (online and target) by name, in checkpoint order."""
        return {k: v for k, v in self._checkpoint_items().items() if isinstance(v, nn.Module)}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer by name, in checkpoint order."""
        return {k: v for k, v in self._checkpoint_items().items() if isinstance(v, torch.optim.Optimizer)}

    def policy_state_dict(self) -> dict[str, Any]:
        """``actor`` (CPU tensor copies of the policy network's state), ``obs_normalizer`` and ``goal_normalizer``
        (their statistics): what [`act`][her_agents.algos.base.GoalConditionedAgentBase.act] needs."""
        return {
            "actor": {k: v.detach().cpu().clone() for k, v in self.actor.state_dict().items()},
            "obs_normalizer": self.obs_normalizer.state_dict(),
            "goal_normalizer": self.goal_normalizer.state_dict(),
        }

    def load_policy_state_dict(self, state: dict[str, Any]) -> None:
        """Load [`policy_state_dict`][her_agents.algos.base.GoalConditionedAgentBase.policy_state_dict].

        Raises:
            RuntimeError / ValueError: a policy network or normalizer of another shape.
        """
        self.actor.load_state_dict(state["actor"])
        self.obs_normalizer.load_state_dict(state["obs_normalizer"])
        self.goal_normalizer.load_state_dict(state["goal_normalizer"])

    def state_dict(self) -> dict[str, Any]:
        """Everything to resume: networks, targets, optimizers, normalizers, counters, config, rng state."""
        state: dict[str, Any] = {k: v.state_dict() for k, v in self._checkpoint_items().items()}
        state["obs_normalizer"] = self.obs_normalizer.state_dict()
        state["goal_normalizer"] = self.goal_normalizer.state_dict()
        state["num_updates"] = self.num_updates
        state["config"] = dataclasses.asdict(self.config)
        state["rng"] = self.rng.bit_generator.state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in self._checkpoint_items().items():
            v.load_state_dict(state[k])
        self.obs_normalizer.load_state_dict(state["obs_normalizer"])
        self.goal_normalizer.load_state_dict(state["goal_normalizer"])
        self.num_updates = int(state["num_updates"])
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]

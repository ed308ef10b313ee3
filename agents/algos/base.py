"""The ``Agent`` protocol (what the loop, the data-parallel wrapper and the actor-learner use of an agent), and
the goal-conditioned pieces DDPG/TD3/SAC/TQC share (openai/baselines HER techniques), one concern per module:

- here (``AgentConfig`` lives in the torch-free ``.configs``): the observation and goal ``RunningNormalizer`` (clip raw +-200, output +-5) and
  the networks' input ``concat(normalize(observation), normalize(goal))`` (``GoalConditionedAgentBase.preprocess``),
  batch -> tensors, the critics' regression, polyak averaging, the update's metrics, and running the update
  eagerly or compiled (``GoalConditionedAgentBase.compiled``);
- ``.acting``: ``act`` with exploration (Gaussian noise ``noise_std`` clipped to ``[-1, 1]``, then per row with
  probability ``random_eps`` a uniform random action), ``value``; ``.numpy_actor`` its numpy fast path;
- ``.agent_state``: checkpoint state (``state_dict``, ``policy_state_dict``) and train/eval mode;
- ``.compiled``: the compiled-or-eager wrapper and the Adam step both modes share;
- ``.targets``: TD targets and their clip; ``.device``: device and precision selection;
- here too, the levers for many updates per env step that act between updates: REDQ's random subset of target
  critics (``target_subset``) and periodic resets (``reset_networks``), both drawn from a torch generator
  seeded by the agent's seed and the update count (``update_generator``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

import numpy as np
import torch
from torch import nn

from .acting import ActingMixin
from .agent_state import AgentStateMixin
from .compiled import CompiledOrEager, init_adam_state, make_adam, reset_adam_state
from .configs import PRECISIONS, AgentConfig
from .device import native_bf16, resolve_device, resolve_precision
from .networks import reinit_
from .normalizer import RunningNormalizer
from .targets import clip_q, q_clip_for_env, td_target, td_target_bounds

__all__ = [
    "PRECISIONS", "Agent", "AgentConfig", "GoalConditionedAgentBase", "TensorBatch", "clip_q", "make_adam",
    "native_bf16", "q_clip_for_env", "resolve_device", "resolve_precision", "td_target", "td_target_bounds",
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




#: ``GoalConditionedAgentBase.update_generator``'s purposes
SUBSET_DRAW, RESET_DRAW = 1, 2


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


class GoalConditionedAgentBase(ActingMixin, AgentStateMixin):
    """Normalizers, preprocessing, batch conversion, the critics' regression, polyak averaging and the update's
    eager-or-compiled call shared by the agents; acting (``ActingMixin``) and checkpoint state
    (``AgentStateMixin``) come from their modules.

    An algorithm builds its networks (the policy network as ``self.actor``) and optimizers (``make_adam``),
    writes its whole update once as a method of tensors (``train_step``) and calls it from ``update`` through
    ``compiled``; it implements ``_policy`` and ``_actor_value`` (acting), ``_target_pairs`` (polyak) and
    ``_checkpoint_items`` (state).

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
        # the seed of the draws between updates (update_generator): torch's when the config has none
        self._draw_seed = (torch.initial_seed() if config.seed is None else int(config.seed)) % 2**64

    def update(self, batch: Any) -> dict[str, float | np.ndarray]:
        """One gradient step on a batch; returns scalar metrics and ``td_error`` ``[B]`` float32."""
        raise NotImplementedError

    # ------------------------------------------------------------------ inputs
    def preprocess(self, observation: torch.Tensor, desired_goal: torch.Tensor) -> torch.Tensor:
        """``concat(normalize(observation), normalize(goal))``: ``[B, obs_dim], [B, goal_dim] -> [B, state_dim]``."""
        return torch.cat(
            [self.obs_normalizer.normalize(observation), self.goal_normalizer.normalize(desired_goal)], dim=-1
        )

    def to_tensor(self, x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A numpy array or tensor as a ``dtype`` tensor on the agent's device (a float32 numpy array on a CPU
        device shares its memory)."""
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=dtype, non_blocking=True)
        if (type(x) is np.ndarray and x.dtype == np.float32 and dtype == torch.float32 and x.flags.writeable
                and self.device.type == "cpu"):
            return torch.from_numpy(x)  # shares the memory: a few us less than as_tensor in every update
        return torch.as_tensor(np.asarray(x), dtype=dtype, device=self.device)

    def batch_to_tensors(self, batch: Any) -> TensorBatch:
        """Attributes (or mapping keys) of ``batch`` -> ``TensorBatch`` on the device.

        numpy arrays and torch tensors are both accepted; a missing ``weight`` means ones. Every ``update()``
        starts here, so this also puts the networks in train mode and marks the start of an update for CUDA graphs
        (``_cuda_graph_step``).
        """
        self.set_training(True)
        self._cuda_graph_step()
        get = batch.get if isinstance(batch, Mapping) else lambda k: getattr(batch, k, None)
        reward = self.to_tensor(get("reward")).reshape(-1)
        weight = get("weight")
        return TensorBatch(
            observation=self.to_tensor(get("observation")),
            desired_goal=self.to_tensor(get("desired_goal")),
            action=self.to_tensor(get("action")),
            reward=reward,
            next_observation=self.to_tensor(get("next_observation")),
            discount=self.to_tensor(get("discount")).reshape(-1),
            terminated=self.to_tensor(get("terminated")).reshape(-1),
            weight=torch.ones_like(reward) if weight is None else self.to_tensor(weight).reshape(-1),
        )

    def update_normalizer(self, observation: np.ndarray, desired_goal: np.ndarray) -> None:
        """Add ``observation [..., obs_dim]`` and ``desired_goal [..., goal_dim]`` to the normalizers."""
        self.obs_normalizer.update(observation)
        self.goal_normalizer.update(desired_goal)

    # ------------------------------------------------------------------ eager or compiled
    #: set False by code that must see every ``optimizer.step()`` (the data-parallel gradient averaging hooks
    #: the optimizers' step): a compiled update then runs the optimizer steps outside its graph
    whole_update_ok: bool = True

    #: compile the update with Inductor's C++ wrapper on a CPU (``CompiledOrEager``); read once, at the
    #: first update (``tests/benchmarks/bench_cpp_wrapper_ab.py`` sets it False on its A agents)
    cpp_wrapper: bool = True

    def compiled(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """``step`` (the agent's bound update method, e.g. ``self.train_step``) as the update calls it: as is
        unless ``config.compile``, else through ``torch.compile`` as one graph (``CompiledOrEager``: mode
        ``"reduce-overhead"``, i.e. CUDA graphs, on a CUDA device, the C++ wrapper on a CPU; eager where compiling
        fails), built once. Compiled, the optimizers' state is created first (``init_adam_state``): the
        graph takes it as an input."""
        if not self.config.compile:
            return step
        for optimizer in self.optimizers().values():
            init_adam_state(optimizer)
        fn = self.__dict__.get("_compiled_step")
        if fn is None:
            self.polyak_params()  # listed outside the graph
            cuda = self.device.type == "cuda"
            fn = self.__dict__["_compiled_step"] = CompiledOrEager(
                step, f"{type(self).__name__}.{step.__name__}", mode="reduce-overhead" if cuda else None,
                cpp_wrapper=self.cpp_wrapper and self.device.type == "cpu", skip_guards=self.whole_update_ok)
        return fn

    def _cuda_graph_step(self) -> None:
        """Called at the start of every update (from ``batch_to_tensors``): with CUDA graphs (a compiled update
        on a CUDA device) tell CUDAGraph Trees that a new update begins, so that all compiled calls of one update
        share one "generation" and its outputs are overwritten only by the next update's replays. A tensor kept
        across updates must therefore be a clone (TD3's ``_last_actor_loss``); the metrics are copied to the host
        within the update."""
        if self.config.compile and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the network forward passes in ``update()``: bf16 autocast on the agent's device when
        ``precision`` (``config.precision`` resolved for the device) is ``"bf16"``, else a no-op.

        Wrap forward passes only (not gradients or optimizer steps): autocast caches the bf16 copies of the
        parameters until the context exits, so a context spanning an optimizer step would reuse stale copies.
        """
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ draws between updates: subset, resets
    def update_generator(self, purpose: int) -> torch.Generator:
        """A CPU ``torch.Generator`` seeded from ``(purpose, seed, num_updates)`` (``config.seed``, else torch's
        initial seed, through ``numpy.random.SeedSequence``): each update's draws are a function of the update
        count, so a resumed run draws what the uninterrupted one drew with no generator state in the checkpoint,
        and the draws of one purpose never shift those of another or the global torch stream. ``purpose``:
        ``SUBSET_DRAW`` or ``RESET_DRAW``."""
        generator = self.__dict__.get("_draw_generator")
        if generator is None:
            generator = self.__dict__["_draw_generator"] = torch.Generator()
        words = np.random.SeedSequence([purpose, self._draw_seed, self.num_updates]).generate_state(2, np.uint32)
        return generator.manual_seed(int(words[0]) << 32 | int(words[1]))

    def target_subset(self) -> torch.Tensor | None:
        """The critics this update's TD target takes its minimum over: int64 ``[target_subset]`` on the device,
        drawn without replacement from ``range(n_critics)`` by ``update_generator`` (REDQ, Chen et al. 2021,
        Algorithm 1); None for all of them (``target_subset`` 0 or ``n_critics``: nothing is drawn)."""
        m = getattr(self.config, "target_subset", 0)
        n = getattr(self.config, "n_critics", 1)
        if not m or m >= n:
            return None
        subset = torch.randperm(n, generator=self.update_generator(SUBSET_DRAW))[:m]
        if self.device.type == "cuda":  # a copy from pageable memory would wait for the device's queue
            return subset.pin_memory().to(self.device, non_blocking=True)
        return subset

    def target_critics(self, state: torch.Tensor, action: torch.Tensor, subset: torch.Tensor | None
                       ) -> torch.Tensor:
        """``critic_target(state, action)`` ``[n_critics, B]``, or only the critics ``subset`` (``[M, B]``)."""
        if subset is None:
            return self.critic_target(state, action)
        return self.critic_target(state, action, members=subset)

    @property
    def adam_same_steps(self) -> bool:
        """Whether every parameter of an optimizer has taken the same Adam steps (``adam_step``'s
        ``same_steps``): not where ``reset_layers: last`` resets restart some parameters' steps."""
        return not (self.config.reset_every and self.config.reset_layers == "last")

    def reset_due(self) -> bool:
        """Whether the update just done (``num_updates``) is followed by a reset (``reset_every``)."""
        every = self.config.reset_every
        return bool(every) and self.num_updates > 0 and self.num_updates % every == 0

    def reset_networks(self) -> list[torch.Tensor]:
        """Re-initialize the layers ``reset_layers`` names (the output layer, or all layers, of the actor and of
        the critics) from ``update_generator``, copy them into their target networks, restart their Adam state
        (``reset_adam_state``), against the primacy bias (Nikishin et al. 2022, Section 4). Called after every
        ``reset_every``-th update; in place, so the compiled update and the numpy actor keep their references.
        Returns the parameters drawn afresh."""
        last = self.config.reset_layers == "last"
        modules = [cast(nn.Module, self.actor.head), cast(nn.Module, self.critic.head)] if last else [
            self.actor, self.critic]
        fresh: list[torch.Tensor] = list(reinit_(modules, self.update_generator(RESET_DRAW)))
        ids = {id(p) for p in fresh}
        with torch.no_grad():
            for target, online in self._target_pairs():
                for name, p in online.named_parameters():
                    if id(p) in ids:
                        target.get_parameter(name).copy_(p)
        for optimizer in self.optimizers().values():
            reset_adam_state(optimizer, fresh)
        return fresh

    # ------------------------------------------------------------------ losses, targets, metrics
    def critic_regression(self, b: TensorBatch, state: torch.Tensor, y: torch.Tensor
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

    critic: nn.Module
    critic_target: nn.Module

    def update_targets(self) -> None:
        """Polyak-average every (target, online) pair of ``_target_pairs`` (one foreach call for all):
        ``target <- polyak * target + (1 - polyak) * online``."""
        targets, online = self.polyak_params()
        with torch.no_grad():
            torch._foreach_lerp_(targets, online, 1.0 - self.config.polyak)

    def polyak_params(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(target parameters, online parameters)`` of ``_target_pairs``, listed once (parameters are
        updated in place)."""
        if "_polyak_params" not in self.__dict__:
            pairs = self._target_pairs()
            self.__dict__["_polyak_params"] = ([p for t, _ in pairs for p in t.parameters()],
                                               [p for _, o in pairs for p in o.parameters()])
        return self.__dict__["_polyak_params"]

    def params(self, module: nn.Module) -> list[torch.Tensor]:
        """``list(module.parameters())``, listed once per module (for ``her_agents.algos.compiled.freeze`` in
        every update)."""
        cache = self.__dict__.setdefault("_param_lists", {})
        if id(module) not in cache:
            cache[id(module)] = (module, list(module.parameters()))  # the module kept: its id stays unique
        return cache[id(module)][1]

    def _target_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """The (target, online) network pairs ``update_targets`` averages."""
        raise NotImplementedError

    @staticmethod
    def flat_metrics(scalars: list[torch.Tensor], td_error: torch.Tensor) -> torch.Tensor:
        """``[len(scalars) + B]`` float32: the scalar metrics, then ``td_error``, detached (what an update step
        returns, so that ``metrics_from_flat`` reads them with one host copy)."""
        return torch.cat([torch.stack([s.detach().float() for s in scalars]), td_error.detach().float()])

    @staticmethod
    def metrics_from_flat(names: tuple[str, ...], flat: torch.Tensor) -> dict[str, float | np.ndarray]:
        """``flat_metrics``' tensor -> ``{name: float}`` and ``td_error`` ``[B]`` float32 (a copy)."""
        host = flat.cpu().numpy()
        out: dict[str, float | np.ndarray] = {k: float(v) for k, v in zip(names, host[: len(names)].tolist())}
        out["td_error"] = host[len(names) :].copy()
        return out

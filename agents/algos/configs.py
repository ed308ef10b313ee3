"""The agents' config dataclasses, one per algorithm, and the registry of their names: torch-free, so that the run
config (``her_agents.config``) and ``her-train --print-config`` type the ``agent`` section without importing
torch or an agent. Each algorithm's module re-exports its own (``her_agents.algos.td3.TD3Config``, ...), and
``her_agents.algos.registry`` pairs each name with its agent class.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..fields import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT_INTERVAL, Bound, check_ranges, check_types, require

__all__ = ["CONFIGS", "PRECISIONS", "AgentConfig", "DDPGConfig", "Precision", "ResetLayers", "SACConfig", "TD3Config",
           "TQCConfig", "algo_name", "config_class", "config_fields"]

Precision = Literal["fp32", "bf16", "auto"]
"""Valid values of [`AgentConfig.precision`][her_agents.algos.configs.AgentConfig.precision]."""
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
ResetLayers = Literal["last", "all"]
"""Valid values of [`AgentConfig.reset_layers`][her_agents.algos.configs.AgentConfig.reset_layers]."""


@dataclass
class AgentConfig:
    """Options shared by all goal-conditioned agents (defaults: openai/baselines HER).

    The discount is not here: it comes with each batch (``batch.discount = gamma^m``).
    """

    hidden: tuple[int, ...] = (256, 256, 256)
    """Hidden layer sizes of actor and critic MLPs (at least one layer, each >= 1)."""
    layer_norm: bool = False
    """LayerNorm after each hidden Linear (before ReLU)."""
    actor_lr: float = 1e-3
    """Adam learning rate of the actor (> 0)."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic(s) (> 0)."""
    actor_weight_decay: float = 0.0
    """Decoupled weight decay (>= 0) of the actor's optimizer, AdamW (Loshchilov & Hutter 2019, "Decoupled Weight
    Decay Regularization", ICLR, Algorithm 2): before each Adam step ``p <- p * (1 - actor_lr *
    actor_weight_decay)``, torch.optim.AdamW's convention (the decay per step is ``lr * weight_decay``: 0.01 at lr
    1e-3 shrinks a weight that has no gradient by 1e-5 a step). 0 (the default): plain Adam, as before."""
    critic_weight_decay: float = 0.0
    """Decoupled weight decay (>= 0) of the critics' optimizer, as ``actor_weight_decay`` with ``critic_lr``: a
    brake on the critics' weights growing under many updates per env step. 0 (the default): plain Adam."""
    polyak: float = 0.95
    """Target update ``target = polyak * target + (1 - polyak) * online``, in ``[0, 1]``."""
    target_update_interval: int = 1
    """Polyak-update the targets every this many updates (>= 0; TD3: every ``policy_delay * interval``). 0 disables
    automatic target updates; the loop may then call ``agent.update_targets()`` itself (baselines HER: once per
    cycle of 40 updates); ``her-train``'s loop does not, so it refuses 0."""
    reset_every: int = 0
    """Re-initialize networks every this many updates (>= 0; 0, the default: never), against the primacy bias
    (Nikishin et al. 2022, "The Primacy Bias in Deep Reinforcement Learning", ICML, Section 4: periodic resets of
    the last layers, or of the whole agent, keeping the replay). After update ``k * reset_every`` the layers
    ``reset_layers`` names of the actor and of every critic are drawn afresh (the constructors' distributions:
    uniform in ``+-1/sqrt(fan_in)``, LayerNorm 1/0), their target copies take the new values, and their Adam
    state (moments and step count) restarts at zero; SAC/TQC's temperature restarts at ``alpha`` with its Adam
    state, as the paper's code builds a new agent (it does for its SAC and its DrQ resets alike). The
    normalizers and the replay are kept. The draw is seeded by ``seed`` and the update count, so a resumed
    run resets as the uninterrupted one."""
    reset_layers: ResetLayers = "last"
    """What ``reset_every`` re-initializes: ``"last"`` (the default), the output layer of the actor and of each
    critic; ``"all"``, every layer of them (the paper's SAC on DMC states resets everything)."""
    q_clip: tuple[Bound, Bound] | None = None
    """Clip the TD target to ``[low, high]`` (``low <= high``; a side may be infinite), e.g. ``[-1/(1-gamma), 0]``
    for -1/0 rewards (gamma 0.98 -> -50); None (the default for an agent built directly): no clip, whatever the
    rewards' sign. The training loop, when ``agent.q_clip`` is not configured, sets it from the env's reward
    range (``q_clip_for_env``, also usable by hand: ``q_clip=q_clip_for_env(spec.reward_range, gamma,
    env_id)``)."""
    noise_std: float = 0.2
    """Std (>= 0) of the Gaussian exploration noise added in ``act(deterministic=False)`` (actions in ``[-1, 1]``)."""
    random_eps: float = 0.3
    """Per-row probability (in ``[0, 1]``) of replacing the exploration action by a uniform random action."""
    noise_beta: float = 0.0
    """Color (>= 0) of the exploration noise: the exponent ``beta`` of its power spectrum ``1 / f^beta`` over an
    episode (Eberhard et al. 2023, ICLR, "Pink Noise Is All You Need"). 0 (the default) draws independent noise
    at every step, as before; 1 (pink) keeps more of it in slow components, so a noisy move lasts several steps; 2
    is red (Brownian-like). It colors the Gaussian draws of ``act(deterministic=False)``: the ``noise_std`` noise of
    DDPG/TD3, the policy's own sampling of SAC/TQC (their ``noise_std`` extra noise stays white)."""
    noise_horizon: int = 50
    """Length (>= 1, env steps) of each colored noise sequence when ``noise_beta > 0``, meant to be the episode
    length: left out of a config, the training loop sets the env's (Fetch: 50), and starts an env's new sequence
    at the end of each of its episodes
    ([`Agent.reset_noise`][her_agents.algos.Agent.reset_noise])."""
    norm_eps: float = 1e-2
    """Std floor (> 0) of the observation/goal normalizers."""
    norm_clip_obs: float = 200.0
    """Raw observations/goals are clipped to ``+-norm_clip_obs`` (> 0) before normalization."""
    norm_clip_range: float = 5.0
    """Normalized inputs are clipped to ``+-norm_clip_range`` (> 0)."""
    seed: int | None = None
    """Seed of the numpy generator used for exploration noise (torch seeding is the caller's job)."""
    precision: Precision = "fp32"
    """``"fp32"``, ``"bf16"`` or ``"auto"``: with ``"bf16"`` the network forward passes in ``update()`` run under
    ``torch.autocast(dtype=torch.bfloat16)`` (matmuls in bf16, faster on CPUs with AVX512-BF16/AMX and on GPUs);
    the networks return float32, so TD targets, losses and ``td_error`` are float32, and parameters, gradients
    and optimizer state stay float32. ``act()`` always runs in float32. ``"auto"`` is bf16 where the device
    multiplies bf16 natively (``resolve_precision``) and fp32 elsewhere: on a CPU without AVX512-BF16 or AMX,
    bf16 matmuls are emulated and many times slower than fp32."""
    compile: bool = False
    """Run ``update()`` through ``torch.compile`` (Inductor): the same update function, its losses, gradients,
    Adam steps and polyak update traced into one graph, which fuses the LayerNorm, activation, bf16-cast and
    optimizer kernels between the matmuls and leaves no Python, autograd-engine or optimizer overhead between them
    (data-parallel training keeps the optimizer steps out of the graph: it averages gradients before each one). On
    a CUDA device the graph runs under CUDA graphs. The first update pays for compilation (1-2 min on a CPU, where
    the update's wrapper is C++ too; Inductor caches it on disk); on a CPU it needs a C++ compiler. Where
    compilation fails, one warning says why and the agent runs eagerly. Off by default; the Push (but
    ``fetch_push_ddpg_n3``), PickAndPlace and Slide configs set it."""

    def __post_init__(self) -> None:
        """Converts each field to its annotated type (``hidden`` and ``q_clip`` become tuples, ints become floats
        where a float is expected) and checks the ranges.

        Raises:
            ValueError: one line starting with the field's name: a value of the wrong type, a choice not among
                ``precision``'s, a value out of range.
        """
        check_types(self)
        check_ranges(self, {
            "hidden": (lambda v: len(v) >= 1 and min(v) >= 1,
                       "a non-empty list of positive integers (hidden layer sizes must be positive)"),
            "actor_lr": POSITIVE, "critic_lr": POSITIVE, "polyak": UNIT_INTERVAL,
            "actor_weight_decay": NON_NEGATIVE, "critic_weight_decay": NON_NEGATIVE,
            "target_update_interval": NON_NEGATIVE, "reset_every": NON_NEGATIVE,
            "q_clip": (lambda v: v is None or v[0] <= v[1], "null or [low, high] with low <= high"),
            "noise_std": NON_NEGATIVE, "random_eps": UNIT_INTERVAL, "noise_beta": NON_NEGATIVE,
            "noise_horizon": AT_LEAST_ONE,
            "norm_eps": POSITIVE, "norm_clip_obs": POSITIVE, "norm_clip_range": POSITIVE,
        })


@dataclass
class TD3Config(AgentConfig):
    """TD3 options (see [`her_agents.algos.configs.AgentConfig`][] for the shared ones)."""

    action_l2: float = 1.0
    """Weight (>= 0) of ``mean(a^2)`` (a = the actor's tanh output in ``[-1, 1]``) added to the actor loss."""
    n_critics: int = 2
    """Number of critics (>= 1); the target is the min over all of them (see ``clipped_double_q``), or over a random
    subset (``target_subset``)."""
    target_subset: int = 0
    """REDQ's random subset (Chen et al. 2021, "Randomized Ensembled Double Q-Learning: Learning Fast Without a
    Model", ICLR, Algorithm 1): ``M`` in ``[1, n_critics]`` makes each update's TD target bootstrap from
    the minimum over ``M`` target critics drawn at random (without replacement, anew every update) out of the
    ``n_critics``; 0 (the default) is the minimum over all of them, as before. Any other value also makes the
    actor maximize the mean of all ``n_critics`` critics (REDQ's policy update) instead of ``Q_1``. Needs
    ``clipped_double_q``. The draw is seeded by ``seed`` and the update count, so runs repeat and resume
    exactly."""
    clipped_double_q: bool = True
    """The TD target bootstraps from the minimum over the target critics (clipped double Q-learning, Fujimoto et al.
    2018, Eq. 10); false: from their mean, a less pessimistic target while successes are rare."""
    policy_noise: float = 0.2
    """Std (>= 0) of the target policy smoothing noise (actions in ``[-1, 1]``)."""
    noise_clip: float = 0.5
    """The smoothing noise is clipped to ``[-noise_clip, noise_clip]`` (>= 0)."""
    policy_delay: int = 2
    """Actor (and target) update every ``policy_delay`` (>= 1) critic updates."""

    def __post_init__(self) -> None:
        """Raises:
            ValueError: as ``AgentConfig.__post_init__``, and a TD3 option out of its range."""
        super().__post_init__()
        check_ranges(self, {"action_l2": NON_NEGATIVE, "n_critics": AT_LEAST_ONE, "policy_noise": NON_NEGATIVE,
                            "noise_clip": NON_NEGATIVE, "policy_delay": AT_LEAST_ONE})
        check_target_subset(self)
        require(self.clipped_double_q or not self.target_subset, "target_subset",
                "0 with clipped_double_q false (the subset's minimum is the clipped double-Q target)",
                self.target_subset)


@dataclass
class DDPGConfig(AgentConfig):
    """DDPG options (see [`her_agents.algos.configs.AgentConfig`][] for the shared ones)."""

    action_l2: float = 1.0
    """Weight (>= 0) of ``mean(a^2)`` (a = the actor's tanh output in ``[-1, 1]``) added to the actor loss."""

    # TD3's pieces, fixed off (class constants, not config keys): one critic, no smoothing, no delay
    n_critics: ClassVar[int] = 1
    policy_noise: ClassVar[float] = 0.0
    noise_clip: ClassVar[float] = 0.0
    policy_delay: ClassVar[int] = 1
    clipped_double_q: ClassVar[bool] = True  # over one critic: the critic itself
    target_subset: ClassVar[int] = 0

    def __post_init__(self) -> None:
        """Raises:
            ValueError: as ``AgentConfig.__post_init__``, and a negative ``action_l2``."""
        super().__post_init__()
        check_ranges(self, {"action_l2": NON_NEGATIVE})


@dataclass
class SACConfig(AgentConfig):
    """SAC options (see [`her_agents.algos.configs.AgentConfig`][] for the shared ones)."""

    noise_std: float = 0.0
    """Extra Gaussian noise in ``act(deterministic=False)`` on top of the policy's sampling (default none)."""
    random_eps: float = 0.0
    """Per-row probability of a uniform random action in ``act(deterministic=False)`` (default none)."""
    action_l2: float = 0.0
    """Weight (>= 0) of ``mean(a^2)`` on the sampled tanh action added to the actor loss."""
    n_critics: int = 2
    """Number of critics (>= 1); the soft target and the actor use the min over all of them (but see
    ``target_subset``)."""
    target_subset: int = 0
    """REDQ's random subset (Chen et al. 2021, "Randomized Ensembled Double Q-Learning: Learning Fast Without a
    Model", ICLR, Algorithm 1): ``M`` in ``[1, n_critics]`` makes each update's soft TD target bootstrap
    from the minimum over ``M`` target critics drawn at random (without replacement, anew every update) out of the
    ``n_critics``; 0 (the default) is the minimum over all of them, as before. Any other value also makes the
    actor maximize the mean of all ``n_critics`` critics (REDQ's policy update) instead of their minimum. REDQ
    itself: 10 critics, a subset of 2, 20 critic updates per env step (``train.updates_per_step``) and one policy
    update per env step (here the actor steps at every update). The draw is seeded by ``seed`` and the update
    count, so runs repeat and resume exactly. TQC refuses it (its target truncates the pooled quantiles
    instead)."""
    autotune: bool = True
    """Learn the temperature to reach ``target_entropy``; False keeps ``alpha`` fixed."""
    alpha: float = 0.2
    """Temperature (> 0): fixed when ``autotune=False``, the initial one when ``autotune=True``."""
    alpha_lr: float = 1e-3
    """Adam learning rate (> 0) of ``log_alpha``."""
    target_entropy: float | None = None
    """Target policy entropy for autotune; None means ``-action_dim``."""
    log_std_min: float = -20.0
    """Lower clamp of the policy's log std (<= ``log_std_max``)."""
    log_std_max: float = 2.0
    """Upper clamp of the policy's log std."""

    def __post_init__(self) -> None:
        """Raises:
            ValueError: as ``AgentConfig.__post_init__``, and a SAC option out of its range."""
        super().__post_init__()
        check_ranges(self, {"action_l2": NON_NEGATIVE, "n_critics": AT_LEAST_ONE, "alpha": POSITIVE,
                            "alpha_lr": POSITIVE,
                            "log_std_min": (lambda v: v <= self.log_std_max, "<= log_std_max")})
        check_target_subset(self)


@dataclass
class TQCConfig(SACConfig):
    """TQC options: SAC's ([`her_agents.algos.configs.SACConfig`][]; ``n_critics`` is the number of quantile
    critics)
    and the quantile ones."""

    n_quantiles: int = 25
    """Quantiles (>= 1) each critic outputs, at the fractions ``(2m + 1) / (2 n_quantiles)``."""
    top_quantiles_to_drop_per_net: int = 2
    """The target drops this many (>= 0, < ``n_quantiles``) of the largest atoms per critic from the pooled,
    sorted target atoms."""

    def __post_init__(self) -> None:
        """Raises:
            ValueError: as ``SACConfig.__post_init__``, and a quantile option out of its range."""
        super().__post_init__()
        check_ranges(self, {
            "n_quantiles": AT_LEAST_ONE,
            "top_quantiles_to_drop_per_net": (lambda v: 0 <= v < self.n_quantiles, ">= 0 and < n_quantiles"),
        })
        require(self.target_subset == 0, "target_subset", "0 for TQC (its target drops the largest pooled "
                "quantiles instead: top_quantiles_to_drop_per_net)", self.target_subset)


def check_target_subset(config: TD3Config | SACConfig) -> None:
    """Raises:
        ValueError: ``target_subset`` outside ``[0, n_critics]`` (one line naming both)."""
    require(0 <= config.target_subset <= config.n_critics, "target_subset",
            f"0 (all critics) or in [1, n_critics] (n_critics is {config.n_critics})", config.target_subset)


#: the registered algorithm names and their config dataclasses (the agent classes: ``registry.AGENTS``)
CONFIGS: dict[str, type[AgentConfig]] = {"ddpg": DDPGConfig, "td3": TD3Config, "sac": SACConfig, "tqc": TQCConfig}


def algo_name(algo: str) -> str:
    """The registered name of ``algo`` (case-insensitive: ``"TD3"`` -> ``"td3"``).

    Raises:
        ValueError: not a registered algorithm (lists the valid ones).
    """
    key = str(algo).lower()
    if key not in CONFIGS:
        raise ValueError(f"unknown algo {algo!r}; valid algos: {sorted(CONFIGS)}")
    return key


def config_class(algo: str) -> type[AgentConfig]:
    """The config dataclass of ``algo`` (``DDPGConfig``, ``TD3Config``, ``SACConfig``, ``TQCConfig``).

    Raises:
        ValueError: as ``algo_name``.
    """
    return CONFIGS[algo_name(algo)]


def config_fields(algo: str) -> list[str]:
    """Names of the config options of ``algo``."""
    return [f.name for f in dataclasses.fields(config_class(algo))]

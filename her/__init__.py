"""her: Hindsight Experience Replay for any off-policy code. numpy only.

Four separate pieces, composed by ``HerReplayBuffer`` (semantics: ``docs/semantics.md``):

- ``EpisodeStorage``: where data lives (whole episodes, states once, ring overwrite by whole episodes);
  an ``EpisodeWriter`` holds it and stages each env's episode in progress, handing it over when it ends;
- a ``Sampler`` (``UniformSampler``, ``PrioritizedSampler``, ``EnergySampler``): which transitions are drawn, from
  the storage passed to every call;
- a ``Relabeler`` (``FutureGoals``, ``FinalGoal``, ``EpisodeGoals``, ``MixedGoals``, ``NoRelabel``; by name
  ``make_relabeler(RelabelStrategy.FUTURE, k)`` or ``make_relabeler("future", k)``): which goal they get;
- a ``Returns`` (``OneStepReturn``, ``NStepReturn``): how their return is built, rewards via ``compute_reward``.

Apart from the replay, ``MinDensityGoals`` chooses behaviour goals (which goal a training episode pursues) from
the stored achieved goals (MEGA, Pitis et al. 2020).

Each piece can be replaced by any object with the protocol's methods, e.g.
``HerReplayBuffer(storage, reward_fn, relabeler=MyRelabeler(), returns=NStepReturn(3, 0.98))``.

Example::

    import her
    storage = her.EpisodeStorage(1_000_000, observation_shape=(25,), action_shape=(4,), goal_shape=(3,),
                                 max_episode_steps=50)
    buffer = her.HerReplayBuffer(storage, env.unwrapped.compute_reward, strategy="future", n_sampled_goal=4)
    buffer.add(obs, action, reward, next_obs, terminated, truncated)   # one step of each env (buffer.writer)
    batch = buffer.sample(256)                                          # her.Batch of numpy arrays
    buffer.update_priorities(batch.index, td_error)                     # with a PrioritizedSampler only

A goal env that ends episodes on success passes its vectorized ``compute_terminated`` too
(``HerReplayBuffer(storage, env.unwrapped.compute_reward, compute_terminated=...)``): ``terminated`` is then
recomputed for relabeled goals.

Importing ``her`` imports neither torch, gymnasium nor wandb.
"""

from ._util import ParameterError
from .buffer import Batch, HerReplayBuffer, check_compute_reward
from .goals import MinDensityGoals, ValueFn
from .relabel import (
    EpisodeGoals,
    FinalGoal,
    FutureGoals,
    HindsightRelabeler,
    MixedGoals,
    NoRelabel,
    Relabeler,
    RelabelStrategy,
    make_relabeler,
)
from .returns import NStepReturn, OneStepReturn, ReturnBatch, Returns, RewardFn, SuccessFn, TerminatedFn, make_returns
from .samplers import EnergySampler, PrioritizedSampler, Sampler, UniformSampler, trajectory_energy
from .storage import EpisodeStorage, storage_from_env
from .writer import EpisodeWriter

# The pieces, their protocols and factories, the buffer that composes them and its batch. Helpers of one module
# (segment trees: her.trees; signature checks: her.buffer) are imported from that module.
__all__ = [
    "Batch",
    "EnergySampler",
    "EpisodeGoals",
    "EpisodeStorage",
    "EpisodeWriter",
    "FinalGoal",
    "FutureGoals",
    "HerReplayBuffer",
    "HindsightRelabeler",
    "MinDensityGoals",
    "MixedGoals",
    "NStepReturn",
    "NoRelabel",
    "OneStepReturn",
    "ParameterError",
    "PrioritizedSampler",
    "RelabelStrategy",
    "Relabeler",
    "ReturnBatch",
    "Returns",
    "RewardFn",
    "Sampler",
    "SuccessFn",
    "TerminatedFn",
    "UniformSampler",
    "ValueFn",
    "check_compute_reward",
    "make_relabeler",
    "make_returns",
    "storage_from_env",
    "trajectory_energy",
]
__version__ = "0.1.0"

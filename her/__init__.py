"""her: Hindsight Experience Replay for any off-policy code. numpy only.

Four separate pieces (ARCHITECTURE.md "Data flow"), composed by ``HerReplayBuffer``:

- ``EpisodeStorage``: where data lives (whole episodes, states once, ring overwrite by whole episodes);
- ``UniformSampler`` / ``PrioritizedSampler``: which transitions are drawn;
- ``GoalRelabeler``: which goal they get (``future``, ``final``, ``episode``; k = ``n_sampled_goal``);
- n-step returns inside ``HerReplayBuffer``: how their return is built, rewards via ``compute_reward``.

Example::

    import her
    storage = her.EpisodeStorage(1_000_000, observation_shape=(25,), action_shape=(4,), goal_shape=(3,),
                                 max_episode_steps=50)
    buffer = her.HerReplayBuffer(storage, env.unwrapped.compute_reward, strategy="future", n_sampled_goal=4)
    buffer.add(obs, action, reward, next_obs, terminated, truncated)   # one step of each env
    batch = buffer.sample(256)                                          # her.Batch of numpy arrays
    buffer.update_priorities(batch.index, td_error)                     # with a PrioritizedSampler

Importing ``her`` imports neither torch, gymnasium nor wandb.
"""

from .buffer import Batch, HerReplayBuffer, check_compute_reward
from .relabel import STRATEGIES, GoalRelabeler
from .samplers import PrioritizedSampler, UniformSampler
from .storage import EpisodeStorage, storage_from_env
from .trees import MaxTree, MinTree, SegmentTree, SumTree

__all__ = [
    "STRATEGIES",
    "Batch",
    "EpisodeStorage",
    "GoalRelabeler",
    "HerReplayBuffer",
    "MaxTree",
    "MinTree",
    "PrioritizedSampler",
    "SegmentTree",
    "SumTree",
    "UniformSampler",
    "check_compute_reward",
    "storage_from_env",
]
__version__ = "0.1.0"

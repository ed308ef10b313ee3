"""Training in several processes under torchrun: data-parallel (``data_parallel``: every rank runs the loop on
its own envs and replay, gradients all-reduced) and actor-learner (``actor_learner``: Ape-X, actors feed one
learner over RPC). Both read torchrun's rendezvous and check that every rank holds the same config with
``launch``; the data-parallel ranks reach each other only through ``collective``."""

from .actor_learner import train_actor_learner
from .data_parallel import DataParallelAgent, DistContext, train_data_parallel

__all__ = ["DataParallelAgent", "DistContext", "train_actor_learner", "train_data_parallel"]

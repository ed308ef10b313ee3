"""What a run owns: its directory and lock, and the signals that stop it (``run_control``), the checkpoint and
replay files (``checkpoint``, written through ``atomic``, the replay's in ``replay_files``), the log (stdout,
``metrics.csv``, W&B: ``logger``, with the run's own record of what W&B has saved, so that a resume sends what W&B
may lack without reading W&B's files) and videos (``video``)."""

from .checkpoint import load_checkpoint, save_checkpoint, save_run_state, write_atomic
from .logger import NullLogger, RunLogger
from .run_control import GracefulStop, RunDirInUse, RunDirLock, RunFailed, TrainingStopped, prepare_run_dir
from .video import record_episodes, write_video

__all__ = [
    "GracefulStop", "NullLogger", "RunDirInUse", "RunDirLock", "RunFailed", "RunLogger", "TrainingStopped", "load_checkpoint",
    "prepare_run_dir", "record_episodes", "save_checkpoint", "save_run_state", "write_atomic", "write_video",
]

"""Launched by torchrun in tests/test_distributed.py: ``her-train`` with per-rank extra overrides.

``HER_TEST_RANK<r>_OVERRIDES="key=value ..."`` adds overrides on rank r only (to launch inconsistent ranks).
``HER_TEST_KILL_AFTER_CHECKPOINT=<env_steps>`` makes every rank fail right after the checkpoint of that env step
is written, as a run killed there would (to resume it).
``HER_TEST_SLOW_MAIN_FINISH=<seconds>`` makes rank 0 linger that long after its loop (as writing its last files
would) and every rank stamp, in ``$HER_DIST_DUMP``, when its loop ended (``loop_end<r>``) and when it left
``train_main`` (``exit<r>``).
"""

import os
import sys
import time
from pathlib import Path

import her_agents.distributed.data_parallel as dist_mod
import her_agents.loop.steps as steps_mod
from her_agents.cli import train_main


def _fail_after_checkpoint(env_steps: int) -> None:
    real = steps_mod.save_training_state

    def save(run_dir, cfg, state, *args, **kwargs):
        real(run_dir, cfg, state, *args, **kwargs)
        if state.counters["env_steps"] == env_steps:
            # a kill, not an error: no handler runs (an OSError would read as a failed checkpoint write, whose
            # metrics rows are cut back)
            print(f"simulated kill after the checkpoint at {env_steps} env steps", file=sys.stderr, flush=True)
            os._exit(17)

    steps_mod.save_training_state = save


def _slow_main_finish(seconds: float) -> None:
    real, rank = dist_mod.train, os.environ.get("RANK", "0")

    def train(*args, **kwargs):
        result = real(*args, **kwargs)
        if rank == "0":
            time.sleep(seconds)
        out = Path(os.environ["HER_DIST_DUMP"])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"loop_end{rank}").write_text(repr(time.time()))
        return result

    dist_mod.train = train


if __name__ == "__main__":
    if os.environ.get("HER_TEST_KILL_AFTER_CHECKPOINT"):
        _fail_after_checkpoint(int(os.environ["HER_TEST_KILL_AFTER_CHECKPOINT"]))
    if os.environ.get("HER_TEST_SLOW_MAIN_FINISH"):
        _slow_main_finish(float(os.environ["HER_TEST_SLOW_MAIN_FINISH"]))
    args = sys.argv[1:] + os.environ.get(f"HER_TEST_RANK{os.environ.get('RANK', '0')}_OVERRIDES", "").split()
    code = train_main(args)
    if os.environ.get("HER_TEST_SLOW_MAIN_FINISH"):
        (Path(os.environ["HER_DIST_DUMP"]) / f"exit{os.environ.get('RANK', '0')}").write_text(repr(time.time()))
    sys.exit(code)

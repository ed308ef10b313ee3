"""Read back what a W&B run logged from its local transaction logs (``<run_dir>/wandb/*-<id>/run-<id>.wandb``).

W&B writes every record of a run, online or offline, to such a file before it is uploaded; a resumed run reads
them to find the evaluation rows the W&B run lacks (see [`her_agents.run.logger.RunLogger`][]). wandb has no
public
reader for the format, so this is a small one.

Format: a 7-byte header (``:W&B``, magic, version), then LevelDB-log framing (32 KiB blocks; each chunk: crc32
(4 bytes), length (2, little endian), type (1 full, 2 first, 3 middle, 4 last)) of serialized
``wandb.proto.wandb_internal_pb2.Record`` messages. A file cut short by a kill ends at its last whole record.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["final_state", "history_rows", "logged_env_steps", "read_records", "run_files"]

BLOCK = 32768
HEADER = 7


def read_records(path: str | Path) -> Iterator[Any]:
    """The ``Record`` messages of one transaction log, in order; stops at a truncated or corrupt tail.

    Raises:
        ValueError: the file is not a W&B transaction log.
    """
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"not a W&B transaction log: {path}")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # zero padding
            pos += HEADER
            continue
        if pos + HEADER + length > len(data) or kind not in (1, 2, 3, 4):
            return  # written only in part when the process died
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            rec = pb.Record()  # type: ignore[attr-defined]  # a generated module without stubs (classes made at import)
            try:
                rec.ParseFromString(pending)
            except DecodeError:
                return
            pending = b""
            yield rec


def history_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every ``run.log`` row of one transaction log, as ``{key: value}`` (nested keys joined by ``/``)."""
    rows = []
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({"/".join(it.nested_key) if it.nested_key else it.key: json.loads(it.value_json)
                         for it in rec.history.item})
    return rows


def final_state(path: str | Path) -> tuple[int | None, dict[str, Any]]:
    """``(exit_code, summary)`` of one transaction log: the exit code ``run.finish`` recorded (None if the process
    died first) and the summary keys set over the run (``run_status``, ``error``, the last row's values)."""
    exit_code, summary = None, {}
    for rec in read_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "summary":
            for it in rec.summary.update:
                summary["/".join(it.nested_key) if it.nested_key else it.key] = json.loads(it.value_json)
        elif kind == "exit":
            exit_code = int(rec.exit.exit_code)
    return exit_code, summary


def run_files(wandb_dir: str | Path, run_id: str) -> list[Path]:
    """The transaction logs of run ``run_id`` under ``wandb_dir`` (one per process that logged to it), oldest
    first (the directory names hold the start time)."""
    def order(path: Path) -> tuple[str, int]:
        # <offline->run-<YYYYmmdd_HHMMSS>-<id>[-<n>]: W&B appends -<n> when a resumed run starts in the same second
        stamp, _, rest = path.parent.name.split("run-", 1)[-1].partition(f"-{run_id}")
        return stamp, int(rest[1:]) if rest[1:].isdigit() else 0

    files = [p for p in Path(wandb_dir).glob(f"*run-*-{run_id}*/run-{run_id}.wandb")
             if order(p)[1] or p.parent.name.endswith(f"-{run_id}")]
    return sorted(files, key=order)


def logged_env_steps(wandb_dir: str | Path, run_id: str) -> set[int]:
    """``env_steps`` of every row run ``run_id`` logged with an ``env_steps`` key, over all its local logs."""
    steps: set[int] = set()
    for f in run_files(wandb_dir, run_id):
        try:
            steps.update(int(r["env_steps"]) for r in history_rows(f) if "env_steps" in r
                         and "eval/success_rate" in r)
        except (OSError, ValueError):
            continue
    return steps

"""Read back the history rows of an offline W&B run file (``run-<id>.wandb``), for tests.

The file is wandb's transaction log: a 7-byte header (":W&B", magic, version) then LevelDB-log framing
(32 KiB blocks; each chunk: crc32 (4), length (2, little endian), type (1: full, 2: first, 3: middle, 4: last))
of serialized ``wandb.proto.wandb_internal_pb2.Record`` messages.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def read_records(path: str | Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"not a W&B transaction log: {path}"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            pending = b""
            yield rec


def history_rows(path: str | Path) -> list[dict]:
    """Every ``run.log`` row of the run file, as {key: value}."""
    rows = []
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({"/".join(it.nested_key) if it.nested_key else it.key: json.loads(it.value_json)
                         for it in rec.history.item})
    return rows

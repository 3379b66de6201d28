"""The MPI messages between the compute agent (rank 0) and the processors: tags and the
task header's fields, written down once for both sides (and the dtype codes the channel's
header uses too)."""

from __future__ import annotations

from typing import Any

import numpy as np

TASK, RESULT, STOP, CALIBRATE, ECHO = 1, 2, 3, 4, 5
# product, shard index, dtype code, rows, depth (k1 - k0), n, B follows, batch, k0
TASK_FIELDS = 9
DTYPES: dict[int, np.dtype[Any]] = {0: np.dtype(np.float32), 1: np.dtype(np.float64)}
CODES: dict[np.dtype[Any], int] = {v: k for k, v in DTYPES.items()}

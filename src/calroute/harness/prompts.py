"""The load generator's token-id prompts as it sends them: lists and JSON arrays of workload/tokens.py's ids.

A prompt is a function of (key, length, seed) only (``distinct_prompt_ids``), so a run can be replayed
byte for byte; its ids lie in [10, 1000), valid for the emulator and for the real tiny model.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError
from calroute.workload.tokens import distinct_prompt_ids


def prompt_ids(key: int | str, length: int, seed: int = 0) -> list[int]:
    """The prompt as a list of ``length`` token ids in [10, 1000)."""
    return distinct_prompt_ids(key, length, seed).tolist()  # type: ignore[no-any-return]


def prompt_json(key: int | str, length: int, seed: int = 0) -> bytes:
    """The prompt as a JSON array, e.g. ``b'[ 17,523, 88]'``, built without a per-token Python loop.

    Every id is written in a 3-character field (ids below 100 get a leading space, which JSON allows as
    whitespace), so the text is a numpy byte-matrix: about 50x faster than ``json.dumps`` of a list for a
    4,096-token prompt, which keeps a load generator's CPU for keeping its schedule.
    """
    return ids_json(distinct_prompt_ids(key, length, seed))


def ids_json(ids: npt.NDArray[np.int64]) -> bytes:
    """Token ids in [0, 1000) as a JSON array, each in a 3-character field (see prompt_json)."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= 1000):
        raise ConfigError("ids_json writes token ids in [0, 1000) only")
    length = len(ids)
    cells = np.empty((length, 4), dtype=np.uint8)
    cells[:, 0] = np.where(ids < 100, ord(" "), ord("0") + ids // 100)
    cells[:, 1] = ord("0") + (ids // 10) % 10
    cells[:, 2] = ord("0") + ids % 10
    cells[:, 3] = ord(",")
    return b"[" + cells.tobytes()[:-1] + b"]"

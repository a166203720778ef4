"""The answer cache of ``POST /api/estimate``: :class:`ResponseCache`."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Final

__all__ = ["CACHED_ESTIMATES", "CACHE_BYTES", "ResponseCache", "cache_key"]

#: Answers of ``/api/estimate`` kept (about 8 KiB each), and their bytes (keys included) at most.
CACHED_ESTIMATES: Final = 512
CACHE_BYTES: Final = 8 * 2**20


class ResponseCache:
    """Recent answers of ``/api/estimate``, keyed by the *normalised* workload (every key with
    its validated value, :func:`~vramlens.workload.load.workload_to_dict`), never by the request
    body: padding, key order or spelling (``8k``) cannot make two entries of one workload, and a
    key is a few hundred bytes whatever the body was. At most :data:`CACHED_ESTIMATES` answers
    and :data:`CACHE_BYTES` bytes of keys and answers are kept, least recently used dropped first.
    Only successful answers are kept; an ``upload:`` token names its upload's content, so a
    cached answer stays right."""

    def __init__(self, capacity: int = CACHED_ESTIMATES, max_bytes: int = CACHE_BYTES) -> None:
        self._answers: OrderedDict[bytes, bytes] = OrderedDict()
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        """Bytes of the keys and answers held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: bytes) -> bytes | None:
        answer = self._answers.get(key)
        if answer is not None:
            self._answers.move_to_end(key)
        return answer

    def put(self, key: bytes, answer: bytes) -> None:
        if len(key) + len(answer) > self._max_bytes:
            return
        old = self._answers.pop(key, None)
        if old is not None:
            self._bytes -= len(key) + len(old)
        self._answers[key] = answer
        self._bytes += len(key) + len(answer)
        while len(self._answers) > self._capacity or self._bytes > self._max_bytes:
            dropped, value = self._answers.popitem(last=False)
            self._bytes -= len(dropped) + len(value)


def cache_key(report: bool, workload: Any) -> bytes:
    """The cache key of a validated workload: the answer's kind and its normalised keys."""
    from vramlens.workload.load import workload_to_dict

    normalised = json.dumps(workload_to_dict(workload), sort_keys=True, separators=(",", ":"))
    return (b"r" if report else b"v") + normalised.encode()

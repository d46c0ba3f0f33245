"""The result a sized step returns (``--seq-result-bytes``), the same for every contender:
a JSON object of about ``size`` bytes — an index and rows of short strings, the shape of a
page of records a step fetches. The rows are hex digests, so the database's compression
(TOAST) cannot shrink them to nothing: what the tables hold is about what was written."""

from __future__ import annotations

import hashlib
from typing import Any

#: Characters of each row's text (at most 128: one SHA-512 hex digest).
ROW = 90


def sized_result(index: int, size: int) -> dict[str, Any]:
    """About ``size`` bytes of JSON (``int`` ≥ 0) for step ``index``."""
    rows = max(1, size // (ROW + 3))
    return {"index": index, "rows": [_row(index, row) for row in range(rows)]}


def _row(index: int, row: int) -> str:
    """``ROW`` hex characters, different for each step and row."""
    digest = hashlib.sha512(f"{index}:{row}".encode()).hexdigest()
    return digest[:ROW]

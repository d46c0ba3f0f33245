"""The result a sized step returns (``--seq-result-bytes``), the same for every contender:
a JSON object of about ``size`` bytes — an index and rows of short strings, the shape of a
page of records a step fetches."""

from __future__ import annotations

from typing import Any

#: Characters of each row's text.
ROW = 90


def sized_result(index: int, size: int) -> dict[str, Any]:
    """About ``size`` bytes of JSON (``int`` ≥ 0) for step ``index``."""
    rows = max(1, size // (ROW + 3))
    return {"index": index, "rows": [f"{index:08d}".ljust(ROW, "x") for _ in range(rows)]}

"""The base of the conformance suites this package ships (leases, fencing, waits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any


class ConformanceSuite:
    """A mixin for Django's ``TransactionTestCase``: the suites' rules are its ``test_*``
    methods. To a type checker it declares the ``TestCase`` methods the rules call; at run
    time the ``TestCase`` the suite is mixed into provides them."""

    if TYPE_CHECKING:  # unittest.TestCase provides these
        assertEqual: Callable[..., None]
        assertIsNone: Callable[..., None]
        assertIsNotNone: Callable[..., None]
        assertIs: Callable[..., None]
        assertIsInstance: Callable[..., None]
        assertIn: Callable[..., None]
        assertTrue: Callable[..., None]
        assertFalse: Callable[..., None]
        assertGreater: Callable[..., None]
        assertGreaterEqual: Callable[..., None]
        assertRaises: Callable[..., Any]
        assertRaisesRegex: Callable[..., Any]
        assertLogs: Callable[..., Any]
        fail: Callable[..., Any]
        subTest: Callable[..., Any]
        _testMethodName: str

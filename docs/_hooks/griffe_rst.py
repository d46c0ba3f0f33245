"""Griffe extension for the API reference: our docstrings' reStructuredText bits as Markdown.

The docstrings are written for ``help()`` and editors as much as for the site: Sphinx roles
(``:class:`~django_leases.leases.HeldLease```) become code spans (the last part of the
dotted name where ``~`` asks for it), and a paragraph ending in ``::`` (a literal block
follows, indented) ends in ``:``. Double backquotes are already Markdown code spans.
Nothing else is changed: the docstrings are the reference's only text.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?\w+:`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")
LITERAL = re.compile(r"(\S)::$", re.M)


def _role(match: re.Match[str]) -> str:
    short, text, target = match[1], match[2].strip(), match[3]
    if target:
        return f"`{text}`"
    return f"`{text.rsplit('.', 1)[-1] if short else text}`"


def markdown(text: str) -> str:
    """``text`` (a docstring) with Sphinx roles as code spans and ``::`` as ``:``."""
    return LITERAL.sub(r"\1:", ROLE.sub(_role, text))


class RstToMarkdown(griffe.Extension):
    """Rewrite each docstring once, as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)

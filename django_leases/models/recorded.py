"""A recorded JSON value decoded only when it is read (:class:`RecordedJSONField`): what a
pass reads of its run's steps carries each step's result as the JSON text the database
holds, and a result is decoded the first time something reads it — the workflow, when its
``run.step`` replays that step. A pass that resumes a workflow whose frame already saw the
earlier steps never reads their results again, so it never decodes them.

A leaf: no model imports (the models use it).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models
from django.db.models.query_utils import DeferredAttribute

#: The suffix of the attribute that holds a value's JSON text until it is read
#: (``result`` → ``result_text``): also the name a query annotates the text with.
TEXT_SUFFIX = "_text"


class _DecodedOnRead(DeferredAttribute):
    """The field's attribute: a value loaded as JSON text (:func:`defer_decoding`) is
    decoded on its first read and kept; any other value reads as Django reads it."""

    def __get__(self, instance: models.Model | None, cls: type | None = None) -> Any:
        if instance is None:
            return self
        data = instance.__dict__
        name = self.field.attname
        if name not in data:
            key = name + TEXT_SUFFIX
            if key in data:
                text = data.pop(key)
                data[name] = None if text is None else json.loads(text)
        return super().__get__(instance, cls)


class RecordedJSONField(models.JSONField):
    """A ``JSONField`` whose value a query may load as JSON text, decoded when first read
    (:func:`defer_decoding`); stored, compared and migrated as a ``JSONField`` (its
    migrations name ``django.db.models.JSONField``: the column is the same)."""

    descriptor_class = _DecodedOnRead

    def deconstruct(self) -> Any:
        """As ``JSONField``'s: the column and what migrations say of it are the same."""
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


def defer_decoding(instance: models.Model, name: str, text: str | None) -> None:
    """Give ``instance``'s :class:`RecordedJSONField` ``name`` the JSON ``text`` (``str``,
    or ``None`` for SQL ``NULL``) the database holds, to be decoded when first read
    (``json.loads``; a JSON ``null`` and SQL ``NULL`` both read as ``None``). Whatever the
    attribute held before is dropped."""
    instance.__dict__.pop(name, None)
    instance.__dict__[name + TEXT_SUFFIX] = text


__all__ = ["TEXT_SUFFIX", "RecordedJSONField", "defer_decoding"]

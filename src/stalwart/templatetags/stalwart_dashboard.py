"""Small filters for the dashboard's templates: ages, durations, sizes. All return plain
text, which the templates escape like everything else."""

from datetime import datetime
from typing import Any

from django import template

register = template.Library()
NOTHING = "\u2013"  # an en dash: no value


@register.filter
def duration(seconds: float | None) -> str:
    """Seconds as a short duration: 42 s, 7 min, 3.5 h, 2.1 d."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return NOTHING  # None, or a missing value (a template's "")
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@register.simple_tag
def ago(moment: datetime | None, now: datetime) -> str:
    """How long before ``now`` (or after it) ``moment`` is."""
    if moment is None:
        return NOTHING
    seconds = (now - moment).total_seconds()
    return f"{duration(seconds)} ago" if seconds >= 0 else f"in {duration(seconds)}"


@register.filter
def megabytes(value: int | None) -> str:
    return NOTHING if value is None else f"{value / 1024 / 1024:.0f} MB"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """``mapping[key]`` in a template, None when absent."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def short_id(value: Any) -> str:
    """A job id cut to what tells it apart: its first 8 hex digits (a UUIDv7's, the time it
    was made, to the minute or so), then its last 12 (random: two jobs of one bulk enqueue
    differ there). The page gives the whole id in a title."""
    text = str(value)
    return text if len(text) <= 21 else f"{text[:8]}…{text[-12:]}"


@register.simple_tag
def took(start: datetime | None, end: datetime | None) -> str:
    """How long from ``start`` to ``end`` (an attempt's run), or a dash."""
    if start is None or end is None:
        return NOTHING
    return duration((end - start).total_seconds())

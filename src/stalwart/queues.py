"""Queue names, and the ordered queue lists that workers claim from."""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from stalwart.exceptions import InvalidQueueName

MAX_QUEUE_NAME_LENGTH = 64
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise ``InvalidQueueName``."""
    if not isinstance(name, str) or not name:
        raise InvalidQueueName(f"Queue name {name!r} must be a non-empty string.")
    if len(name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidQueueName(
            f"Queue name {name!r} is {len(name)} characters long; the limit is "
            f"{MAX_QUEUE_NAME_LENGTH}."
        )
    if not _QUEUE_NAME.fullmatch(name):
        raise InvalidQueueName(
            f"Queue name {name!r} may contain only ASCII letters, digits, '_', '-' and '.'."
        )
    return name


@dataclass(frozen=True, slots=True)
class QueuePattern:
    """One entry of a queue list: an exact name, a ``prefix*``, or ``*`` for every queue."""

    name: str
    is_prefix: bool = False

    @property
    def matches_all(self) -> bool:
        return self.is_prefix and not self.name

    def matches(self, queue_name: str) -> bool:
        if self.is_prefix:
            return queue_name.startswith(self.name)
        return queue_name == self.name

    def __str__(self) -> str:
        return f"{self.name}*" if self.is_prefix else self.name

    @classmethod
    def parse(cls, text: str) -> "QueuePattern":
        if text.endswith("*"):
            prefix = text[:-1]
            if prefix:
                validate_queue_name(prefix)
            return cls(prefix, is_prefix=True)
        return cls(validate_queue_name(text))


@dataclass(frozen=True, slots=True)
class QueueSelector:
    """An ordered list of queue patterns, minus exclusions (written ``!name`` or ``!prefix*``).

    Workers claim from the patterns in order: earlier patterns first, and within one pattern
    by priority, then by the time the job became ready.
    """

    patterns: tuple[QueuePattern, ...]
    excluded: tuple[QueuePattern, ...] = ()

    @classmethod
    def parse(cls, spec: str | Iterable[str]) -> "QueueSelector":
        items = spec.split(",") if isinstance(spec, str) else list(spec)
        patterns: list[QueuePattern] = []
        excluded: list[QueuePattern] = []
        for raw in items:
            text = raw.strip()
            if not text:
                continue
            if text.startswith("!"):
                excluded.append(QueuePattern.parse(text[1:]))
            else:
                pattern = QueuePattern.parse(text)
                if pattern not in patterns:
                    patterns.append(pattern)
        if not patterns:
            if not excluded:
                raise InvalidQueueName("A queue list needs at least one queue or '*'.")
            patterns.append(QueuePattern("", is_prefix=True))
        return cls(tuple(patterns), tuple(excluded))

    def serves(self, queue_name: str) -> bool:
        """Whether a worker with this selector claims jobs from ``queue_name``."""
        if any(pattern.matches(queue_name) for pattern in self.excluded):
            return False
        return any(pattern.matches(queue_name) for pattern in self.patterns)

    def __str__(self) -> str:
        return ",".join([str(p) for p in self.patterns] + [f"!{p}" for p in self.excluded])

"""A process's own word on why its jobs may be given back without it: its *verdict*.

Who pays for a death is decided by its cause, not by how the process exited (see
``stalwart.db.Death``). A process that knows the cause says so before it may die, in two
places: its supervisor's status pipe (``forking.tell_parent``; read once the child is reaped)
and its process row's metadata (for a pruner, when there is no supervisor). Whoever gives its
jobs back uses the newest verdict; without one, a process that died is a ``CRASH`` whose
suspects are all the jobs it held, and one that ended on its own (its role returned) gave
them up on purpose: ``INTERRUPTED``.

Verdicts a process gives:

- its heartbeats fail, or its main loop stalls, or a beat hangs on a stalled link: the queue or
  its environment is at fault, ``INTERRUPTED`` (withdrawn once a beat goes through again);
- its memory went over ``max_memory_mb`` while some jobs ran: ``CRASH``, those jobs the
  suspects;
- it stops past its shutdown timeout, or at once (QUIT): ``INTERRUPTED``.

A process frozen as a whole (a task holding the GIL, a stop signal) can say nothing: if the
kernel's deadline ends it, it is a ``CRASH`` of the jobs it ran.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stalwart.db import Death

# The key of a verdict in a process row's metadata.
KEY = "verdict"


@dataclass(frozen=True, slots=True)
class Verdict:
    death: Death
    cause: str
    # With CRASH: the ids of the jobs that may have caused it (None: every job it held).
    suspects: tuple[str, ...] | None = None

    def as_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"death": self.death.value, "cause": self.cause}
        if self.suspects is not None:
            data["suspects"] = list(self.suspects)
        return data

    @classmethod
    def from_data(cls, data: Any) -> "Verdict | None":
        """The verdict ``as_data`` wrote, or None for anything else (a row written by hand,
        an older version's metadata)."""
        if not isinstance(data, Mapping):
            return None
        try:
            death = Death(str(data.get("death")))
        except ValueError:
            return None
        suspects = data.get("suspects")
        if suspects is not None:
            if not isinstance(suspects, list):
                return None
            suspects = tuple(str(job) for job in suspects)
        return cls(death, str(data.get("cause") or ""), suspects)


def interrupted(cause: str) -> Verdict:
    return Verdict(Death.INTERRUPTED, cause)


def suspected(cause: str, jobs: Sequence[Any]) -> Verdict:
    return Verdict(Death.CRASH, cause, tuple(str(job) for job in jobs))


def from_metadata(metadata: Mapping[str, Any] | None) -> Verdict | None:
    return Verdict.from_data((metadata or {}).get(KEY))

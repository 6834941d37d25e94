"""Exceptions raised by Stalwart. Each one carries the facts that explain it."""

from django.core.exceptions import ImproperlyConfigured
from django.tasks.exceptions import InvalidTask


class InvalidTaskArguments(InvalidTask, TypeError, ValueError):
    """Arguments that would not survive a JSON round trip, refused at enqueue.

    A ``TypeError``, as Django's own backends raise for arguments JSON cannot hold (and,
    as before, a ``ValueError`` and an ``InvalidTask``).
    """

    def __init__(self, path: str, problem: str, message: str | None = None) -> None:
        self.path = path
        self.problem = problem
        super().__init__(message or f"{path} {problem}")


class ArgumentsDoNotFit(InvalidTask, TypeError):
    """A call whose arguments the task's function cannot take, refused at enqueue (the same
    ``TypeError`` the call itself would raise, before a worker makes it)."""

    def __init__(self, task_path: str, signature: str, problem: str) -> None:
        self.task_path = task_path
        self.signature = signature
        self.problem = problem
        super().__init__(
            f"{task_path}{signature} cannot be called with these arguments: {problem}."
        )


class TaskNotImportable(InvalidTask):
    """A task that a worker process could not find by its path, refused at enqueue."""

    def __init__(self, task_path: str, reason: str) -> None:
        self.task_path = task_path
        self.reason = reason
        super().__init__(
            f"Task {task_path!r} cannot be enqueued: {reason}, so a worker process could "
            "not import it. Define the task at the top level of a module, such as your "
            "app's tasks.py."
        )


class ArgumentsTooLarge(InvalidTask, ValueError):
    """Encoded arguments larger than the configured ``max_arguments_size``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"Task arguments take {size} bytes as JSON, over the limit of {limit} bytes "
            "(OPTIONS['max_arguments_size'])."
        )


class InvalidQueueName(InvalidTask, ValueError):
    """A queue name outside the allowed alphabet or length."""


class ConfigurationError(ImproperlyConfigured):
    """An invalid ``TASKS[alias]['OPTIONS']`` entry; the message names the setting."""


class TaskNotFound(Exception):
    """A stored task path that does not resolve to a ``django.tasks`` task object.

    ``elsewhere``: another release of the project may have it (the module or the name is
    missing here, as in a worker still on the old code during a rolling deploy), as opposed
    to a path that can never be a task (not a dotted path, not a task object)."""

    def __init__(self, path: str, reason: str, *, elsewhere: bool = False) -> None:
        self.path = path
        self.reason = reason
        self.elsewhere = elsewhere
        super().__init__(f"{path!r} {reason}")


class InvalidStoredArguments(Exception):
    """Recorded as a job's error when its stored ``args`` or ``kwargs`` cannot be a call's
    arguments (the row was written or changed outside ``enqueue()``): never retried."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"The job's stored arguments cannot be passed to its task: {problem}. Enqueue "
            "never stores them so; the row was changed by hand, and no retry can fix it."
        )


class ProcessDied(Exception):
    """Recorded as a job's error when the process running it died of something the job may
    have caused (a crash while it ran alone, memory, a stall of its whole process)."""


class JobInterrupted(Exception):
    """Recorded as a job's error when its attempts were interrupted by the queue or its
    environment (an outage, a stop, a neighbour's crash) more often than the job's
    ``max_interruptions`` allows: past that budget, an interruption is charged."""


class NotAStalwartBackend(TypeError):
    """A Stalwart-only API was called for a task whose backend is not Stalwart."""


class TransactionLeftOpen(Exception):
    """Recorded as a job's error when its task returned inside an open transaction."""

    def __init__(self, aliases: list[str]) -> None:
        self.aliases = aliases
        names = ", ".join(f"DATABASES[{alias!r}]" for alias in aliases)
        super().__init__(
            f"The task returned with a transaction still open on {names}; it was rolled back, "
            "so its writes there are lost."
        )


class JobTimedOut(Exception):
    """Recorded as a job's error when an attempt ran past its task's ``timeout``."""

    def __init__(self, timeout: float, process: str) -> None:
        self.timeout = timeout
        self.process = process
        super().__init__(
            f"The attempt ran longer than the task's timeout of {timeout:g} s. Its thread could "
            f"not be stopped, so its worker process {process} was replaced."
        )


class OutcomeNotStored(Exception):
    """Recorded as a job's error when the database refused to store its real outcome."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"The attempt's outcome could not be stored: {reason}")


class JobCancelled(Exception):
    """Raised by a task that stops because its job was cancelled while it ran
    (``context.raise_if_cancelled()``), and recorded as the error of a cancelled attempt."""

    def __init__(self, message: str = "The job was cancelled while it ran.") -> None:
        super().__init__(message)


class InvalidDependency(InvalidTask, ValueError):
    """A job asked to run after jobs it cannot run after: an unknown (or pruned) job, a job
    of another backend or database, a value that is not a job's result, a bad ``on_failure``.
    Raised at the call; nothing is enqueued."""


class ParentFailed(Exception):
    """Recorded in a dependant's errors when it is cancelled because a job it runs after
    failed for good, was cancelled, or was deleted (its dependency's ``on_failure`` was
    ``"cancel"``). Never raised in a task."""


class InvalidBatch(InvalidTask, ValueError):
    """A batch asked to do what it cannot: take jobs once finished, close twice, take a
    callback that is not a task (or of another backend). Raised at the call; nothing is
    stored."""

"""``--reload`` for ``queue work`` and ``queue supervise``: start again when the project's
code changes, for development.

Two processes, as with ``runserver``. The first (the parent) runs the same
command again as a child, and again whenever the child exits with ``RELOAD_STATUS``; it
forwards ``INT``, ``TERM`` and ``QUIT`` to the child, which runs in a process group of its
own, so that a Ctrl-C reaches it once. The child runs the command, and watches the files of
the modules it has imported (its task modules among them) with Django's autoreloader
(``django.utils.autoreload``: Watchman if it is installed, else polling once a second). When
a Python file changes, the child stops as for ``TERM`` (running jobs finish first), and
exits with ``RELOAD_STATUS``.

Not ``runserver``'s ``run_with_reloader``: it runs the command in a thread, where signal
handlers cannot be installed, and kills the child a quarter of a second after a Ctrl-C,
while its jobs run.
"""

import contextlib
import importlib.util
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stalwart import events

CHILD = "STALWART_RELOAD_CHILD"
RELOAD_STATUS = 75  # the child's "start me again" (EX_TEMPFAIL); 3 is a fenced process's


def in_child() -> bool:
    return os.environ.get(CHILD) == "true"


def run_parent() -> int:
    """Run the command as a child until it exits for another reason than a code change;
    return its exit status."""
    from django.utils import autoreload

    arguments = autoreload.get_child_arguments()
    environment = {**os.environ, CHILD: "true"}
    while True:
        child = subprocess.Popen(arguments, env=environment, process_group=0)

        def forward(signum: int, frame: Any, child: subprocess.Popen = child) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

        previous = {
            signum: signal.signal(signum, forward)
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)
        }
        try:
            status = child.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if status != RELOAD_STATUS:
            return status if status >= 0 else 128 - status


class CodeWatcher:
    """In the child: watch the project's Python files; on a change, call ``on_change`` once
    (the command then stops and exits with ``RELOAD_STATUS``)."""

    def __init__(self, on_change: Callable[[], None], process: str) -> None:
        from django.utils import autoreload

        self.on_change = on_change
        self.process = process
        self.changed: Path | None = None
        self.reloader = autoreload.get_reloader()
        self._thread = threading.Thread(target=self._run, name="stalwart-reload", daemon=True)

    def start(self) -> "CodeWatcher":
        from django.utils.autoreload import file_changed

        from stalwart import catalog

        loaded = catalog.load()  # the task modules, watched from the start
        for module in loaded.failed if loaded is not None else ():
            # One that fails to import is not in sys.modules: watch its file, to start again
            # once it is fixed.
            with contextlib.suppress(ImportError, ValueError, AttributeError):
                spec = importlib.util.find_spec(module)
                if spec is not None and spec.origin:
                    self.reloader.extra_files.add(Path(spec.origin))
        file_changed.connect(self._file_changed, dispatch_uid="stalwart.reloading")
        self._thread.start()
        return self

    def _run(self) -> None:
        from django.utils.autoreload import autoreload_started

        autoreload_started.send(sender=self.reloader)
        self.reloader.run_loop()

    def _file_changed(self, sender: Any, file_path: Path, **kwargs: Any) -> bool:
        if sender is not self.reloader or Path(file_path).suffix != ".py":
            return False
        if self.changed is None:
            self.changed = Path(file_path)
            events.emit("code_changed", process=self.process, file=str(file_path))
            self.reloader.stop()
            self.on_change()
        return True  # handled: Django's reloader must not exit this thread itself

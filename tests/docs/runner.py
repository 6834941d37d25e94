"""Run a page's samples, in order, in its project:
``python -m tests.docs.runner PLAN REPORT`` (both JSON files).

Run by ``tests/docs/test_samples.py`` in the project's directory, with its settings. Each
step is a block of the page (``samples.py`` says which kinds there are); what the runner
does with it:

- ``settings``, ``options``: nothing more (the project's settings hold them): at the start,
  every backend of ``TASKS`` is loaded and Django's checks run, so a bad setting fails;
- ``file``: imported (a module the page wrote);
- ``code``: its functions and classes are appended to its module (``accounts/tasks.py``),
  which is imported again; the rest runs in the page's namespace (``await`` allowed);
- ``pycon``: run as a doctest in the namespace; ids, process names and times in the output
  are compared as what they are, not as their values;
- ``console``: each ``$ python manage.py ...`` runs as a process of the project. ``queue
  work`` (without ``--stop-when-empty``) and ``queue supervise`` run in the background until
  no job is ready, blocked or running, then get a Ctrl-C (``SIGINT``) and must exit 0. The
  output shown must appear (numbers, ids and times aside; a log line by its ``action=``),
  unless the block's output is unchecked; ``$ echo $?`` checks the exit status before it.

The first step that fails ends the run; the report says where, what was expected and what
happened.
"""

import ast
import asyncio
import doctest
import importlib
import inspect
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Seconds, for one command: a sample runs in seconds alone, and this leg runs beside eight
# others on two cores.
TIMEOUT = 120.0


def _tail(output: str | bytes | None, lines: int = 40) -> str:
    """The last lines a command wrote, for a failure's message."""
    if not output:
        return ""
    text = output.decode(errors="replace") if isinstance(output, bytes) else output
    return "\n".join(text.splitlines()[-lines:]) + "\n"


QUIET_FOR = 0.5  # seconds without a job ready, blocked or running: a worker may stop

UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
PROCESS = re.compile(r"\b(?:worker|supervisor|dispatcher|scheduler)-[\w.-]+?-\d+-[0-9a-f]{4}\b")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:\d\d|Z)?")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
ACTION = re.compile(r"\baction=(\w+)")


class SampleFailed(Exception):
    """A sample did not do what its page says."""


def normalize(text: str) -> str:
    """Ids, process names, times and numbers as what they are; spaces collapsed."""
    text = UUID.sub("<id>", text)
    text = PROCESS.sub("<process>", text)
    text = TIMESTAMP.sub("<time>", text)
    text = NUMBER.sub("<n>", text)
    return " ".join(text.split())


# -- the project -----------------------------------------------------------------------------


def prepare_databases() -> None:
    """Create this page's databases on the servers, if it names any, and migrate them all."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    prefix = os.environ.get("DOCS_SAMPLES_DATABASE_PREFIX", "docs_samples")
    for alias, database in settings.DATABASES.items():
        name = str(database.get("NAME", ""))
        if database["ENGINE"].endswith("postgresql") and name.startswith(prefix):
            import psycopg

            with psycopg.connect(
                host=database["HOST"],
                port=database["PORT"],
                user=database["USER"],
                password=database["PASSWORD"],
                dbname="postgres",
                autocommit=True,
            ) as server:
                if not server.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", [name]
                ).fetchone():
                    server.execute(f'CREATE DATABASE "{name}"')
        elif database["ENGINE"].endswith("mysql") and name.startswith(prefix):
            import MySQLdb

            server = MySQLdb.connect(
                host=database["HOST"],
                port=int(database["PORT"]),
                user=database["USER"],
                password=database["PASSWORD"],
            )
            try:
                server.cursor().execute(
                    f"CREATE DATABASE IF NOT EXISTS `{name}` "
                    "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                )
            finally:
                server.close()
        call_command("migrate", database=alias, verbosity=0)
        connections[alias].close()


def check_settings() -> None:
    """Load every backend of ``TASKS`` (which reads its options) and run Django's checks."""
    from django.core.management import call_command
    from django.tasks import task_backends

    for alias in task_backends.settings:
        task_backends[alias]  # loading it reads and checks its options
    call_command("check", fail_level="ERROR", stdout=io.StringIO())


def check_options(text: str, *, options: bool) -> None:
    """Read the Stalwart backends' options this piece of settings gives, as the backend
    does (``ConfigurationError`` names a bad one)."""
    from django.conf import settings

    from stalwart.conf import read_options

    if options:
        read_options("default", {"OPTIONS": eval("{" + text + "}")})  # noqa: S307 - the page's
        return
    namespace: dict[str, Any] = {"BASE_DIR": Path(settings.BASE_DIR)}
    exec(text, namespace)  # noqa: S102 - the page's own settings
    for alias, params in namespace.get("TASKS", {}).items():
        if params != {...} and params.get("BACKEND") == "stalwart.backend.StalwartBackend":
            read_options(alias, params)


# -- steps -----------------------------------------------------------------------------------


class Page:
    def __init__(self, project: Path) -> None:
        self.project = project
        self.namespace: dict[str, Any] = {"__name__": "docs_sample"}
        self.last_status: int | None = None
        self.namespace.update(run_worker=self.run_worker, wait_until=wait_until, page=self)
        # The job ids the page shows, and the ones they were here: an id printed by one
        # sample and used by a later one is the same job (a hidden setup may add some).
        self.ids: dict[str, str] = {}

    def learn_ids(self, shown: str, actual: str) -> None:
        """Pair the ids in what the page shows with those in what was printed, in order."""
        pairs = zip(UUID.findall(shown), UUID.findall(actual), strict=False)
        self.ids.update({page_id: real for page_id, real in pairs if page_id not in self.ids})

    def with_ids(self, text: str) -> str:
        """``text`` with the ids the page showed replaced by the real ones."""
        return UUID.sub(lambda match: self.ids.get(match[0], match[0]), text)

    def run(self, step: dict[str, Any]) -> None:
        kind = step["kind"]
        if kind in ("code", "pycon", "console"):
            step = {**step, "text": self.with_ids(step["text"])}
        if kind in ("settings", "options"):
            # In the project's settings (the last of a setting wins), and checked on its own.
            check_options(step["text"], options=kind == "options")
            return
        if kind == "file":
            self.import_file(step["path"])
        elif kind == "code":
            self.run_code(step["text"], step["module"], step["where"])
        elif kind in ("setup", "check"):
            self.execute(step["text"], step["where"])
        elif kind == "pycon":
            self.run_pycon(step["text"], step["where"])
        elif kind == "console":
            self.run_console(step["text"], unchecked=step["unchecked"])
        else:
            raise SampleFailed(f"no way to run a {kind!r} block")

    # Python

    def import_file(self, path: str) -> None:
        module = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        if module.endswith(".settings"):
            return
        self.namespace.update(_public(self.load(module)))

    def load(self, module: str) -> Any:
        importlib.invalidate_caches()
        if module in sys.modules:
            return importlib.reload(sys.modules[module])
        return importlib.import_module(module)

    def run_code(self, text: str, module_path: str, where: str) -> None:
        tree = ast.parse(text)
        definitions = [
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        if definitions:
            imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
            lines = text.split("\n")
            part = [_source(lines, node) for node in [*imports, *definitions]]
            target = self.project / module_path
            existing = target.read_text() if target.exists() else ""
            target.write_text(existing + f"\n\n# -- {where}\n" + "\n\n\n".join(part) + "\n")
            loaded = self.load(module_path.removesuffix(".py").replace("/", "."))
            # Its definitions, those of earlier blocks too: reloaded, they are new objects.
            self.namespace.update(_defined_in(loaded))
            rest = [node for node in tree.body if node not in definitions]
            tree = ast.Module(body=rest, type_ignores=[])
        self.execute(tree, where)

    def execute(self, source: str | ast.Module, where: str) -> None:
        code = compile(source, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        outcome = eval(code, self.namespace)  # noqa: S307 - the page's own sample
        if inspect.iscoroutine(outcome):
            asyncio.run(outcome)

    def run_pycon(self, text: str, where: str) -> None:
        test = doctest.DocTestParser().get_doctest(text, {}, where, where, 0)
        test.globs = self.namespace  # what the examples assign, later steps see
        runner = doctest.DocTestRunner(
            checker=NormalizingChecker(self),
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        )
        report = io.StringIO()
        runner.run(test, out=report.write, clear_globs=False)
        if runner.failures:
            raise SampleFailed(report.getvalue())

    # Commands

    def run_console(self, text: str, *, unchecked: str | None) -> None:
        commands: list[tuple[str, list[str]]] = []
        for line in text.split("\n"):
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands:
                commands[-1][1].append(line)
            elif line.strip():
                raise SampleFailed(f"output before any command: {line!r}")
        for command, expected in commands:
            self.run_command(command, expected, unchecked=unchecked)

    def run_command(self, command: str, expected: list[str], *, unchecked: str | None) -> None:
        words = shlex.split(command, comments=True)
        if words == ["echo", "$?"]:
            if [str(self.last_status)] != [line.strip() for line in expected if line.strip()]:
                raise SampleFailed(f"$ {command}: the exit status was {self.last_status}")
            return
        quiet = False
        if words[-2:] == [">", "/dev/null"]:
            words, quiet = words[:-2], True
        if words[:2] != ["python", "manage.py"]:
            raise SampleFailed(
                f"$ {command}: only 'python manage.py ...' runs here; mark the block with "
                "<!-- sample: skip REASON --> if it cannot run"
            )
        arguments = words[2:]
        if arguments == ["shell"]:
            return  # the pycon blocks that follow run in the page's namespace: that shell
        background = arguments[:2] == ["queue", "supervise"] or (
            arguments[:2] == ["queue", "work"] and "--stop-when-empty" not in arguments
        )
        status, output, errors = (self.run_in_background if background else self.run_once)(
            arguments
        )
        self.last_status = status
        shown = errors if quiet else output + errors
        # A command the page shows failing must fail; "$ echo $?" after it checks how.
        failing = any(
            line.startswith(("CommandError", "error:", "unhealthy:")) for line in expected
        )
        if (status != 0) != failing:
            raise SampleFailed(
                f"$ {command}: exit status {status}, expected "
                f"{'a failure' if failing else 0}\n{output}{errors}"
            )
        if unchecked is None:
            compare(command, expected, shown)
            self.learn_ids("\n".join(expected), shown)

    def environment(self) -> dict[str, str]:
        paths = [str(self.project), str(Path(__file__).resolve().parents[2])]
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            "DJANGO_SETTINGS_MODULE": "mysite.settings",
            "PYTHONUNBUFFERED": "1",
        }

    def run_once(self, arguments: list[str]) -> tuple[int, str, str]:
        self.close_connections()
        try:
            done = subprocess.run(
                [sys.executable, "manage.py", *arguments],
                cwd=self.project,
                env=self.environment(),
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as late:
            raise SampleFailed(
                f"manage.py {' '.join(arguments)}: no end after {TIMEOUT} s; it wrote:\n"
                f"{_tail(late.stdout)}{_tail(late.stderr)}"
            ) from None
        return done.returncode, done.stdout, done.stderr

    def run_in_background(self, arguments: list[str]) -> tuple[int, str, str]:
        """Start the command; once it has started and no job is waiting or running, press
        Ctrl-C (SIGINT), and wait for it to end."""
        self.close_connections()
        out_path = self.project / ".command.out"
        err_path = self.project / ".command.err"
        with out_path.open("w") as out, err_path.open("w") as err:
            process = subprocess.Popen(
                [sys.executable, "manage.py", *arguments],
                cwd=self.project,
                env=self.environment(),
                stdout=out,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        try:
            wait_until(
                lambda: process.poll() is not None or self.started(process.pid),
                message=f"manage.py {' '.join(arguments)} to start",
            )
            if process.poll() is None:
                self.wait_for_quiet()
                os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: to the foreground group
                process.wait(timeout=TIMEOUT)
        except (SampleFailed, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise SampleFailed(
                f"manage.py {' '.join(arguments)} did not stop\n"
                f"{out_path.read_text()}{err_path.read_text()}"
            ) from None
        return process.returncode, out_path.read_text(), err_path.read_text()

    def started(self, pid: int) -> bool:
        """Whether the command (or a process it started: --reload's child) registered."""
        import psutil

        from stalwart.models import Process

        try:
            pids = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            return False
        try:
            return Process.objects.filter(pid__in=pids).exists()
        finally:
            self.close_connections()

    def wait_for_quiet(self) -> None:
        from stalwart.models import Job

        def quiet() -> bool:
            try:
                return not Job.objects.filter(status__in=["ready", "blocked", "running"]).exists()
            finally:
                self.close_connections()

        since = None

        def quiet_long_enough() -> bool:
            nonlocal since
            if not quiet():
                since = None
                return False
            since = since or time.monotonic()
            return time.monotonic() - since >= QUIET_FOR

        wait_until(quiet_long_enough, message="no job ready, blocked or running")

    def run_worker(self, *arguments: str) -> str:
        """Run ``queue work --stop-when-empty`` (for a page's hidden set-up); its output."""
        status, output, errors = self.run_once(["queue", "work", "--stop-when-empty", *arguments])
        if status != 0:
            raise SampleFailed(f"queue work --stop-when-empty exited {status}\n{output}{errors}")
        return output + errors

    def close_connections(self) -> None:
        from django.db import connections

        connections.close_all()  # SQLite: no lock of ours held while another process writes


def _source(lines: list[str], node: ast.stmt) -> str:
    """A statement's lines, its decorators included."""
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno, *(decorator.lineno for decorator in decorators)])
    return "\n".join(lines[start - 1 : node.end_lineno])


def _defined_in(module: Any) -> dict[str, Any]:
    """The functions, classes and tasks ``module`` defines."""
    from django.tasks import Task

    def own(value: Any) -> bool:
        if isinstance(value, Task):
            return value.func.__module__ == module.__name__
        return getattr(value, "__module__", None) == module.__name__

    return {name: value for name, value in _public(module).items() if own(value)}


def _public(module: Any) -> dict[str, Any]:
    return {name: value for name, value in vars(module).items() if not name.startswith("_")}


def wait_until(condition: Any, *, timeout: float = TIMEOUT, message: str = "") -> Any:
    """Poll ``condition`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SampleFailed(f"timed out after {timeout} s waiting for {message or condition}")
        time.sleep(0.05)  # polling a condition with a deadline


class NormalizingChecker(doctest.OutputChecker):
    """Ids, process names and times compare as what they are, whatever their values."""

    def __init__(self, page: Page) -> None:
        self.page = page

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags) or _shape(want) == _shape(got):
            self.page.learn_ids(want, got)
            return True
        return False


def _shape(text: str) -> str:
    text = UUID.sub("<id>", text)
    text = PROCESS.sub("<process>", text)
    text = TIMESTAMP.sub("<time>", text)
    return " ".join(text.split())


def compare(command: str, expected: list[str], output: str) -> None:
    """Each line shown must be in the output: a log line by its action, any other line
    with its numbers, ids and times as any."""
    actual = [line for line in output.split("\n") if line.strip()]
    actions = {match[1] for line in actual for match in ACTION.finditer(line)}
    lines = {normalize(line) for line in actual}
    missing = []
    for line in expected:
        if not line.strip():
            continue
        action = ACTION.search(line)
        if action and TIMESTAMP.match(line.strip()):
            if action[1] not in actions:
                missing.append(line)
        elif normalize(line) not in lines:
            missing.append(line)
    if missing:
        raise SampleFailed(
            f"$ {command}: the page shows lines the command did not print:\n"
            + "\n".join(f"  {line}" for line in missing)
            + "\nIt printed:\n"
            + "\n".join(f"  {line}" for line in actual)
        )


def _sample_traceback(error: BaseException) -> str:
    """The traceback from the sample's own line on (the runner's frames left out)."""
    frames = traceback.extract_tb(error.__traceback__)
    first = next(
        (index for index, frame in enumerate(frames) if frame.filename.startswith("docs/")),
        0,
    )
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames[first:])]
    return "".join(lines + traceback.format_exception_only(error))


def main() -> int:
    steps = json.loads(Path(sys.argv[1]).read_text())
    report_path = Path(sys.argv[2])
    project = Path.cwd()
    sys.path[:0] = [str(project)]
    import django

    report: dict[str, Any] = {"ran": 0, "failure": None}
    page = Page(project)
    try:
        django.setup()
        prepare_databases()
        check_settings()
    except Exception:  # noqa: BLE001 - reported as the page's failure
        report["failure"] = {"where": "the project's settings", "error": traceback.format_exc()}
        report_path.write_text(json.dumps(report))
        return 1
    report["seconds"] = []
    for step in steps:
        began = time.monotonic()
        try:
            page.run(step)
        except SampleFailed as error:
            report["failure"] = {"where": step["where"], "error": str(error)}
            break
        except Exception as error:  # noqa: BLE001 - reported as the sample's failure
            report["failure"] = {"where": step["where"], "error": _sample_traceback(error)}
            break
        report["ran"] += 1
        report["seconds"].append([step["where"], round(time.monotonic() - began, 2)])
    page.close_connections()
    report_path.write_text(json.dumps(report))
    return 0 if report["failure"] is None else 1


if __name__ == "__main__":
    sys.exit(main())

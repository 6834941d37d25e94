"""Test the package as a user installs it (scripts/test's wheel leg).

    python -m tests.wheel [--database postgresql|sqlite]

1. Copies the checkout (its tracked files and the untracked ones git does not ignore) to a
   temporary directory, and builds there, in parallel, a wheel from the tree and an sdist
   then a wheel from that sdist (``python -m build``, without isolation: with the
   setuptools of the test extra).
2. Checks both with ``twine check``; checks that the two wheels hold the same files with
   the same contents, and that they hold every file of ``src/stalwart`` and the licence.
3. Installs the wheel (with the ``postgresql`` and ``prometheus`` extras) and the test tools
   into a fresh virtualenv, and copies the tests beside the rest of the checkout but
   without ``src/``, so that ``import stalwart`` can only find the installed package; it
   checks that it does.
4. Runs, from that virtualenv: the dashboard tests and a chosen set of acceptance tests
   (SERVER_TESTS) on ``--database`` (PostgreSQL by default), and, at the same time, on
   SQLite, the browser tests, the example project (migrate, check, queue status, the demo,
   every dashboard page: tests/acceptance/test_installed_package.py) and the messages of a
   missing extra (SQLITE_TESTS).

Exits non-zero when any step fails: a template, a static file or a migration left out of
the wheel fails step 2, and the tests of step 4 too.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The test tools the installed package is tested with, by name: their versions are the test
# extra's (pyproject.toml), so they stay in one place.
TEST_TOOLS = (
    "pytest",
    "pytest-django",
    "pytest-xdist",
    "pytest-timeout",
    "selenium",
    "psycopg[pool]",
)

# On the server: the tests whose outcome depends on what the wheel holds (the dashboard's
# templates, the migrations, the management commands, the processes a supervisor forks
# from the installed package), chosen to keep the leg within a few minutes.
SERVER_TESTS = (
    "tests/dashboard",
    "tests/acceptance/test_installed_package.py",
    "tests/acceptance/test_work_command.py",
    "tests/acceptance/test_supervisor.py",
    "tests/acceptance/test_metrics.py",
)
# On SQLite: the browser tests (the dashboard's static files), the example project, and
# the one-line messages of a missing extra.
SQLITE_TESTS = (
    "tests/browser",
    "tests/acceptance/test_installed_package.py",
    "tests/acceptance/test_missing_extras.py",
)


# With the setuptools of the test extra: three isolated environments would each install it.
BUILD = (sys.executable, "-m", "build", "--no-isolation")


class Failed(Exception):
    """A step failed; the message says which and why."""


def say(text: str, stream=sys.stdout) -> None:
    """A line of the leg's log (a script's output, not a test's)."""
    stream.write(f"{text}\n")
    stream.flush()


STARTED = time.monotonic()


def step(title: str) -> None:
    """A step's title, with the seconds since the leg began (to see where its time goes)."""
    say(f"-- [{time.monotonic() - STARTED:4.0f}s] {title}")


def run(*command: str | Path, cwd: Path | None = None, env: dict | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise Failed(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout}")
    return done.stdout


def copy_checkout(to: Path) -> None:
    """The files a clone has (and new ones not yet committed), without build leftovers."""
    git = [shutil.which("git") or "git", "ls-files", "-z", "--cached", "--others"]
    try:
        listed = subprocess.run(
            [*git, "--exclude-standard"], cwd=ROOT, stdout=subprocess.PIPE, check=True
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError) as error:
        raise Failed(f"the leg lists the checkout's files with git ls-files: {error}") from None
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if not source.is_file():  # deleted in the work tree, not yet committed
            continue
        target = to / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode)


def build(tree: Path, work: Path) -> tuple[Path, Path, Path]:
    """(sdist, wheel from the tree, wheel from the sdist), built side by side."""
    from_tree, from_sdist = work / "from-tree", work / "from-sdist"
    builds = [
        # No --sdist/--wheel: build makes the sdist, then the wheel from that sdist.
        [*BUILD, "--outdir", str(from_sdist), str(tree)],
        [*BUILD, "--wheel", "--outdir", str(from_tree), str(tree)],
    ]
    logs = [tempfile.TemporaryFile(mode="w+") for _ in builds]  # noqa: SIM115 - closed below
    processes = [
        subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        for command, log in zip(builds, logs, strict=True)
    ]
    for command, process, log in zip(builds, processes, logs, strict=True):
        status = process.wait()
        log.seek(0)
        output = log.read()
        log.close()
        if status != 0:
            raise Failed(f"{' '.join(command)} exited {status}:\n{output}")
    [sdist] = from_sdist.glob("*.tar.gz")
    [wheel_from_sdist] = from_sdist.glob("*.whl")
    [wheel_from_tree] = from_tree.glob("*.whl")
    return sdist, wheel_from_tree, wheel_from_sdist


def records(wheel: Path) -> dict[str, str]:
    """Each file of the wheel and its hash, as its RECORD lists them (RECORD itself aside)."""
    with zipfile.ZipFile(wheel) as archive:
        [record] = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
        lines = archive.read(record).decode().splitlines()
    listed = dict(line.rsplit(",", 2)[:2] for line in lines if line)
    listed.pop(record)
    return listed


def check_contents(tree: Path, from_tree: Path, from_sdist: Path) -> None:
    built, rebuilt = records(from_tree), records(from_sdist)
    if built != rebuilt:
        differ = sorted(
            name for name in built.keys() | rebuilt.keys() if built.get(name) != rebuilt.get(name)
        )
        raise Failed(f"the wheel built from the sdist differs from the tree's: {differ}")
    package = tree / "src"
    wanted = {
        path.relative_to(package).as_posix()
        for path in (package / "stalwart").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    missing = sorted(wanted - built.keys())
    if missing:
        raise Failed(
            "the wheel lacks files of src/stalwart (add them to [tool.setuptools.package-data] "
            f"in pyproject.toml): {missing}"
        )
    if not any(name.endswith(".dist-info/licenses/LICENSE") for name in built):
        raise Failed("the wheel holds no LICENSE (license-files in pyproject.toml)")
    say(f"   {len(built)} files, the same in both wheels; every file of src/stalwart is there")


def tool_requirements() -> list[str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {tool.partition("[")[0]: tool for tool in TEST_TOOLS}
    chosen = []
    for requirement in extra["optional-dependencies"]["test"]:
        name = requirement.partition(">")[0].partition("[")[0]
        if name in wanted and requirement.startswith(wanted[name]):
            chosen.append(requirement)
    if len(chosen) != len(TEST_TOOLS):
        raise Failed(f"the test extra lacks one of {TEST_TOOLS}: it has {chosen}")
    return chosen


def install(wheel: Path, into: Path) -> Path:
    # No pip of its own (ensurepip is slow): this pip installs into it (--python).
    venv.EnvBuilder(with_pip=False, clear=True).create(into)
    python = into / "bin" / "python"
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--quiet",
        "--disable-pip-version-check",
        f"{wheel}[postgresql,prometheus]",
        *tool_requirements(),
    )
    return python


def copy_tests(tree: Path, to: Path) -> None:
    """The checkout without src/: the tests, the example project and what tests read."""
    for path in tree.rglob("*"):
        relative = path.relative_to(tree)
        if relative.parts[0] in ("src", "build") or not path.is_file():
            continue
        target = to / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        target.chmod(path.stat().st_mode)


def check_import(python: Path, env: dict, where: Path, venv_dir: Path) -> None:
    found = run(python, "-c", "import stalwart; print(stalwart.__file__)", cwd=where, env=env)
    module = Path(found.strip().splitlines()[-1]).resolve()
    say(f"   import stalwart: {module}")
    if module.is_relative_to(ROOT / "src") or not module.is_relative_to(venv_dir.resolve()):
        raise Failed(f"stalwart was imported from {module}, not from the installed wheel")


def start_pytest(
    python: Path, where: Path, env: dict, database: str, *args: str
) -> subprocess.Popen:
    return subprocess.Popen(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=where,
        env={**env, "STALWART_TEST_DATABASE": database},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default="postgresql", choices=("postgresql", "sqlite"))
    database = parser.parse_args().database
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stalwart-wheel-") as directory:
        work = Path(directory)
        try:
            step("copy the checkout, build the sdist and the wheels")
            tree = work / "tree"
            copy_checkout(tree)
            sdist, wheel, rebuilt = build(tree, work)
            say(f"   {sdist.name}, {wheel.name}")
            step("twine check")
            twine = [sys.executable, "-m", "twine", "check", "--strict", sdist, rebuilt]
            say(run(*twine, env={**os.environ, "NO_COLOR": "1"}).strip())
            step("compare the wheels, and the wheel with src/stalwart")
            check_contents(tree, wheel, rebuilt)
            step("install the wheel into a fresh virtualenv")
            venv_dir = work / "venv"
            python = install(wheel, venv_dir)
            where = work / "run"
            copy_tests(tree, where)
            env = {
                key: value
                for key, value in os.environ.items()
                if key not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE")
            }
            env["STALWART_INSTALLED_FROM"] = str(venv_dir)
            env["STALWART_SCREENSHOTS"] = str(ROOT / ".test-artifacts" / "screenshots-wheel")
            check_import(python, env, where, venv_dir)
            step(
                f"tests against the installed package: on {database} "
                f"({', '.join(SERVER_TESTS)}), and on sqlite ({', '.join(SQLITE_TESTS)})"
            )
            runs = [
                start_pytest(
                    python,
                    where,
                    env,
                    database,
                    "-n",
                    "2",
                    "-m",
                    "not faults and not any_database",
                    "--durations=10",
                    *SERVER_TESTS,
                ),
                start_pytest(python, where, env, "sqlite", "-m", "not faults", *SQLITE_TESTS),
            ]
            statuses, outputs = [], []
            for process in runs:
                output, _ = process.communicate()
                say(output)
                statuses.append(process.returncode)
                outputs.append(output)
            # One summary line for both runs, last, as scripts/test counts a leg's results.
            say(summary(outputs, time.monotonic() - began))
            if any(statuses):
                raise Failed(f"the tests against the installed package failed: {statuses}")
        except Failed as failure:
            say(f"error: {failure}", sys.stderr)
            return 1
    return 0


def summary(outputs: list[str], seconds: float) -> str:
    """pytest's last line, for the runs together: ``== 80 passed, 2 skipped in 300s ==``."""
    totals: dict[str, int] = {}
    for output in outputs:
        lines = [line for line in output.splitlines() if re.search(r" in [0-9.]+s", line)]
        for count, word in re.findall(r"(\d+) (\w+)", lines[-1] if lines else "0 failed"):
            totals[word] = totals.get(word, 0) + int(count)
    counts = ", ".join(f"{count} {word}" for word, count in totals.items())
    return f"== the installed package: {counts} in {seconds:.0f}s =="


if __name__ == "__main__":
    sys.exit(main())

"""What the README and the package metadata promise someone with a checkout."""

import re
import shlex
import tomllib

from tests.helpers import ROOT


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_readme_install_lines_name_the_distribution_a_wheel_or_a_path():
    """The Quickstart installs as a user would (the distribution's name), and says that
    until it is published the same line works against a built wheel or a checkout; every
    extra it names exists."""
    readme = (ROOT / "README.md").read_text()
    lines = [line.split("#")[0] for line in readme.splitlines() if line.startswith("pip install")]
    assert lines, "the README has no pip install line"
    project = pyproject()["project"]
    extras = set(project["optional-dependencies"])
    wheel = f"django_stalwart-{project['version']}-py3-none-any.whl"
    requirements = []
    for line in lines:
        words = shlex.split(line)[2:]
        requirement = [word for word in words if not word.startswith("-")][-1]
        requirements.append(requirement)
        name, _, rest = requirement.partition("[")
        assert name == project["name"] or name.endswith(wheel) or "/" in name, requirement
        assert "-e" not in words, f"{line!r} is an editable install"
        assert set(re.findall(r"[\w-]+", rest)) <= extras, requirement
    assert f"{project['name']}[postgresql]" in requirements
    assert any(requirement.startswith(f"./dist/{wheel}") for requirement in requirements)


def test_the_version_is_the_one_in_pyproject():
    """``stalwart.__version__`` is read from the installed distribution's metadata: an
    install older than the checkout (a stale editable install) shows here."""
    import stalwart

    assert stalwart.__version__ == pyproject()["project"]["version"] == "0.1.0"


def test_the_licence_is_shipped_and_named():
    project = pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    assert "BSD 3-Clause License" in (ROOT / "LICENSE").read_text()


def test_the_metadata_lists_every_django_version_supported():
    project = pyproject()["project"]
    assert "Framework :: Django :: 6.0" in project["classifiers"]
    assert "Framework :: Django :: 6.1" in project["classifiers"]
    assert "django>=6.0,<6.2" in project["dependencies"]

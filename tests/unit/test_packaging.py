"""What the README and the package metadata promise someone with a checkout."""

import re
import shlex
import tomllib

from tests.helpers import ROOT


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_readme_install_line_installs_from_a_checkout():
    """Stalwart is on no package index yet: the README's pip line must name the checkout,
    with extras the package has."""
    readme = (ROOT / "README.md").read_text()
    lines = [line.split("#")[0] for line in readme.splitlines() if line.startswith("pip install")]
    assert lines, "the README has no pip install line"
    extras = set(pyproject()["project"]["optional-dependencies"])
    for line in lines:
        requirement = [word for word in shlex.split(line)[2:] if not word.startswith("-")][-1]
        path, _, rest = requirement.partition("[")
        assert path in (".", "./"), f"{line!r} does not install the checkout it is run in"
        assert set(re.findall(r"[\w-]+", rest)) <= extras


def test_the_metadata_lists_every_django_version_supported():
    project = pyproject()["project"]
    assert "Framework :: Django :: 6.0" in project["classifiers"]
    assert "Framework :: Django :: 6.1" in project["classifiers"]
    assert "django>=6.0,<6.2" in project["dependencies"]

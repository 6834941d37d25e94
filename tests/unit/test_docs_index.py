"""docs/index.md names every ``queue`` subcommand, so a reader of the contents finds them."""

import re

from stalwart.cli import SUBCOMMANDS
from tests.helpers import ROOT


def test_the_contents_name_every_subcommand():
    index = (ROOT / "docs" / "index.md").read_text()
    entry = index[index.index("[Management commands]") :].split("\n- ")[0]
    named = set(re.findall(r"`(?:manage\.py queue )?([a-z-]+)`", entry))
    assert set(SUBCOMMANDS) - named == set()

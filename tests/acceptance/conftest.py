from collections.abc import Iterator

import pytest

from tests.helpers import Child


@pytest.fixture
def reaped() -> Iterator[list[Child]]:
    """Children registered here are killed (whole process group) if the test fails."""
    started: list[Child] = []
    yield started
    for child in started:
        child.__exit__()


# 1 -------------------------------------------------------------------------------------------

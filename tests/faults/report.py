"""The fault suite's report: one row per scenario, printed at the end and written to a file.

A scenario puts its row in its test's ``user_properties``, which travel with the test's
report (from pytest-xdist workers too); the run collects them into ``ROWS``.
"""

from dataclasses import asdict, dataclass
from pathlib import Path

from tests.helpers import ROOT

REPORT_FILE = ROOT / ".faults-report.txt"
HEADER = ["scenario", "lost", "duplicated", "overlapping", "stuck", "recovery s", "bound s"]


@dataclass
class Row:
    scenario: str
    lost: int | None
    duplicated: int | None
    overlapping: int | None
    stuck: int | None
    recovery: float | None
    bound: float | None
    result: str

    def cells(self) -> list[str]:
        def show(value: object) -> str:
            if value is None:
                return "-"
            if isinstance(value, float):
                return f"{value:.1f}"
            return str(value)

        return [
            self.scenario,
            *(show(v) for v in (self.lost, self.duplicated, self.overlapping, self.stuck)),
            show(self.recovery),
            show(self.bound),
            self.result,
        ]


ROWS: list[Row] = []
PROPERTY = "stalwart_fault_row"


def as_property(row: Row) -> tuple[str, dict]:
    return (PROPERTY, asdict(row))


def collect(properties: list[tuple[str, object]]) -> None:
    for name, value in properties:
        if name == PROPERTY and isinstance(value, dict):
            ROWS.append(Row(**value))


def table(rows: list[Row]) -> str:
    header = [*HEADER, "result"]
    lines = [header, *(row.cells() for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    text = [
        " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    text.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(text)


def write(rows: list[Row], path: Path = REPORT_FILE) -> str:
    text = table(rows)
    path.write_text(text + "\n")
    return text

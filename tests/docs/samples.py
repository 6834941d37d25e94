"""The code samples of the tutorial and the how-to guides, read from their Markdown.

A page's fenced blocks are its samples, in order. ``python``, ``pycon`` and ``console``
blocks run (``tests/docs/runner.py``); other languages (``text``, ``ini``, ``json``...) show
output or configuration files and are not run. An HTML comment right above a block (blank
lines allowed in between) says more about it to the runner, and shows nothing to a reader:

``<!-- sample: skip REASON -->``
    The block does not run (a systemd unit, a shell command on another machine). The
    tests list every skip with its reason.
``<!-- sample: options -->``
    The ``python`` block is entries of ``TASKS["default"]["OPTIONS"]`` (``"workers": [...],``).
``<!-- sample: output-unchecked REASON -->``
    The ``console`` block runs (its exit status is checked), but its output shows another
    state than the page builds (a cluster of several hosts).
``<!-- sample: module PATH -->``
    Definitions in the following ``python`` blocks go to ``PATH`` (default: the page's
    module, ``accounts/tasks.py``) until the next such comment.
``<!-- sample: file PATH`` ... ``-->``
    Hidden from the reader: write the text between the first line and ``-->`` to ``PATH`` in
    the project, before the next block (a module the page takes for granted).
``<!-- sample: setup`` ... ``-->``
    Hidden from the reader: Python run before the next block, in the page's namespace.
``<!-- sample: check`` ... ``-->``
    Hidden from the reader: Python run after the block above it, in the page's namespace
    (what the page says the block did, checked).

A ``python`` block whose first line is ``# PATH.py`` is that file of the project: a
``settings.py`` is applied to the project's settings, ``urls.py`` becomes its URLconf, and any
other file is written (appended, if an earlier block began it) and imported. A block made
of assignments to upper-case names only is settings too. Any other ``python`` block runs in
the page's namespace, except its functions and classes, which go to the page's module (a
worker imports a task by its module and name) and are imported from there.
"""

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The pages whose samples must run: the tutorial and the how-to guides.
PAGES = sorted(
    path.relative_to(DOCS).as_posix()
    for folder in ("tutorial", "how-to")
    for path in (DOCS / folder).glob("*.md")
)
RUN = ("python", "pycon", "console")
DEFAULT_MODULE = "accounts/tasks.py"

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
DIRECTIVE = re.compile(r"^ *<!-- sample: (?P<kind>[\w-]+)(?P<rest>.*?)(?P<end>-->)?\s*$")
FILE_HEADER = re.compile(r"^# (?P<path>[\w/.-]+\.py)\s*$")
KINDS = {"skip", "options", "output-unchecked", "module", "file", "setup", "check"}
WITH_REASON = {"skip", "output-unchecked"}
WITH_PATH = {"module", "file"}
HIDDEN_CODE = {"file", "setup", "check"}


class SampleError(ValueError):
    """A page's samples are not written as this module expects (a typo in a directive)."""


@dataclass
class Directive:
    kind: str
    argument: str  # the reason, or the path
    text: str  # the hidden code or file, for file, setup and check
    line: int


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, counted from 1
    lang: str
    text: str
    directives: list[Directive] = field(default_factory=list)  # the comments above it
    after: list[Directive] = field(default_factory=list)  # "check" comments below it
    module: str = DEFAULT_MODULE  # where its definitions go

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    def directive(self, kind: str) -> Directive | None:
        return next((each for each in self.directives if each.kind == kind), None)

    @property
    def skip_reason(self) -> str | None:
        found = self.directive("skip")
        return found.argument if found else None

    @property
    def file_path(self) -> str | None:
        """The project file a ``python`` block is (its ``# PATH.py`` first line), if any."""
        first = self.text.split("\n", 1)[0]
        found = FILE_HEADER.match(first) if self.lang == "python" else None
        return found["path"] if found else None

    @property
    def kind(self) -> str:
        """What the runner does with it: settings, options, file, code, pycon or console."""
        if self.lang != "python":
            return self.lang
        if self.directive("options"):
            return "options"
        path = self.file_path
        if path is not None:
            return "settings" if path.endswith("settings.py") else "file"
        return "settings" if is_settings(self.text) else "code"


def is_settings(text: str) -> bool:
    """Assignments to upper-case names (and imports) only: a piece of ``settings.py``."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    assigned = False
    for statement in tree.body:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            continue
        if not isinstance(statement, ast.Assign):
            return False
        for target in statement.targets:
            if not (isinstance(target, ast.Name) and target.id.isupper()):
                return False
        assigned = True
    return assigned


def parse(page: str, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``docs/PAGE``, each with the sample comments above it."""
    lines = (text if text is not None else (DOCS / page).read_text()).split("\n")
    blocks: list[Block] = []
    pending: list[Directive] = []
    module = DEFAULT_MODULE
    number = 0
    while number < len(lines):
        line = lines[number]
        directive = DIRECTIVE.match(line)
        if directive:
            found, number = _directive(page, lines, number, directive)
            if found.kind == "module":
                module = found.argument
            elif found.kind == "check":
                if not blocks:
                    raise SampleError(f"docs/{page}:{found.line}: a check with no block above")
                blocks[-1].after.append(found)
            else:
                pending.append(found)
            continue
        fence = FENCE.match(line)
        if fence and fence["lang"]:
            indent = len(fence["indent"])
            end = number + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise SampleError(f"docs/{page}:{number + 1}: a fence that never closes")
            body = "\n".join(each[indent:] for each in lines[number + 1 : end])
            blocks.append(
                Block(page, number + 1, fence["lang"], body, directives=pending, module=module)
            )
            pending = []
            number = end + 1
            continue
        if pending and line.strip() and not line.lstrip().startswith("<!--"):
            raise SampleError(
                f"docs/{page}:{pending[0].line}: a sample comment must stand right above its "
                f"block; text comes first at line {number + 1}"
            )
        number += 1
    if pending:
        raise SampleError(f"docs/{page}:{pending[0].line}: a sample comment with no block below")
    return blocks


def _directive(page: str, lines: list[str], number: int, match: re.Match) -> tuple[Directive, int]:
    kind, rest = match["kind"], match["rest"].strip()
    where = f"docs/{page}:{number + 1}"
    if kind not in KINDS:
        raise SampleError(f"{where}: unknown sample comment {kind!r} (one of {sorted(KINDS)})")
    text = ""
    end = number
    if match["end"] is None:  # several lines, up to -->
        end = number + 1
        while end < len(lines) and lines[end].strip() != "-->":
            end += 1
        if end == len(lines):
            raise SampleError(f"{where}: a sample comment that never ends (-->)")
        text = "\n".join(lines[number + 1 : end])
    if kind in WITH_REASON and not rest:
        raise SampleError(f"{where}: '{kind}' needs a reason")
    if kind in WITH_PATH and not rest:
        raise SampleError(f"{where}: '{kind}' needs a path")
    if kind in HIDDEN_CODE and not text:
        raise SampleError(f"{where}: '{kind}' needs its text on the lines below, up to -->")
    if kind not in HIDDEN_CODE and text:
        raise SampleError(f"{where}: '{kind}' takes one line")
    return Directive(kind, rest, text, number + 1), end + 1


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in parse(page)]


def skipped() -> list[Block]:
    """The samples that do not run, each with its reason."""
    return [block for block in all_blocks() if block.lang in RUN and block.skip_reason]


def unchecked() -> list[Block]:
    """The samples that run, but whose output shown is not compared, each with its reason."""
    return [
        block
        for block in all_blocks()
        if block.lang in RUN and not block.skip_reason and block.directive("output-unchecked")
    ]

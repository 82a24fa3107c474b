"""The project's pages as the docs test reads them: the pages themselves, their fenced code blocks
(indented ones inside list items too), the marker a block may carry, the commands of a block and
what a transcript block says its commands print.

A fenced block is one of:
  * a transcript: its first line starts with "$ "; each "$ " line (with the lines continuing it:
    after a "\\", or starting with the prompt "> ") is a command, the lines up to the next one
    what it prints;
  * commands: a block labelled sh, run as a whole;
  * anything else (a diagram, a file's layout), which nothing runs.
A block may be preceded by one marker line, an HTML comment that the rendered page does not show:
  <!-- docs-test: skip: REASON -->   it cannot run here (a cluster, a GPU), and says why.
In what a transcript prints, "..." alone on a line stands for any number of lines and "…" inside a
line for any text (a time, a rate)."""
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
ANY_LINES = "..."
ANY_TEXT = "…"


@dataclass
class Block:
    page: str          # path relative to the source root
    line: int          # line number of the opening fence
    label: str         # the fence's info string ("sh", or "")
    lines: List[str]   # the block's lines, its indentation removed
    skip: Optional[str]  # the reason given by a skip marker, or None

    @property
    def where(self):
        return f"{self.page}:{self.line}"

    @property
    def is_transcript(self):
        return bool(self.lines) and self.lines[0].startswith("$ ")

    @property
    def is_commands(self):
        return self.label == "sh" and not self.is_transcript


def read(path):
    with open(path, encoding="utf-8") as file:
        return file.read()


def pages(source_root, folders=("docs",), extra=("README.md",)):
    """(path relative to source_root, text) of the given pages and every Markdown file under the
    given folders, sorted."""
    paths = list(extra)
    for folder in folders:
        for directory, _, names in os.walk(os.path.join(source_root, folder)):
            paths += [os.path.relpath(os.path.join(directory, name), source_root)
                      for name in names if name.endswith(".md")]
    return [(path, read(os.path.join(source_root, path))) for path in sorted(set(paths))]


def blocks(page, text):
    """Every fenced block of a page, in order. A marker that does not precede a fence is an error
    (it would silently apply to nothing)."""
    found, lines = [], text.splitlines()
    number = 0
    while number < len(lines):
        fence = FENCE.match(lines[number])
        if not fence:
            number += 1
            continue
        indent, label = fence.group(1), fence.group(2)
        body, end = [], number + 1
        while end < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[end]):
            body.append(lines[end][len(indent):] if lines[end].startswith(indent) else lines[end].lstrip())
            end += 1
        previous = lines[number - 1] if number > 0 else ""
        marker = MARKER.match(previous)
        found.append(Block(page, number + 1, label, body, parse_marker(marker.group(1), page, number) if marker else None))
        number = end + 1
    return found


def parse_marker(text, page, number):
    kind, _, reason = text.partition(":")
    if kind.strip() != "skip" or not reason.strip():
        raise ValueError(f"{page}:{number}: a docs-test marker is 'skip: REASON', not '{text}'")
    return reason.strip()


def stray_markers(page, text):
    """Markers not directly above a fence: they mark nothing."""
    lines = text.splitlines()
    return [f"{page}:{number + 1}: a docs-test marker above no code block"
            for number, line in enumerate(lines)
            if MARKER.match(line) and not (number + 1 < len(lines) and FENCE.match(lines[number + 1]))]


def commands(block_lines):
    """The shell text of a commands block, as written (comments and all)."""
    return "\n".join(block_lines) + "\n"


def transcript(block_lines) -> List[Tuple[str, List[str]]]:
    """(command, the lines it is shown to print) of each "$ " command of a transcript. A command
    goes on over lines after one ending in "\\", and over lines starting with the shell's
    continuation prompt "> "."""
    steps = []
    continuing = False
    for line in block_lines:
        if line.startswith("$ "):
            steps.append([line[2:], []])
        elif steps and not steps[-1][1] and (continuing or line.startswith("> ")):
            steps[-1][0] += "\n" + (line[2:] if line.startswith("> ") else line)
        else:
            steps[-1][1].append(line)
        continuing = line.endswith("\\") and not steps[-1][1]
    return [(command, shown) for command, shown in steps]


def line_pattern(shown):
    return re.compile("^" + ".*?".join(re.escape(part) for part in shown.rstrip().split(ANY_TEXT)) + "$")


def mismatch(shown, printed):
    """None when the printed lines are what the shown lines say (with "..." and "…"), else a
    description of the first shown line that no printed line matches where it must."""
    shown = [line.rstrip() for line in shown]
    while shown and not shown[-1]:
        shown.pop()
    printed = [line.rstrip() for line in printed]
    while printed and not printed[-1]:
        printed.pop()
    patterns = [None if line == ANY_LINES else line_pattern(line) for line in shown]

    # Matches shown[i:] against printed[j:]; the furthest shown line reached explains a failure.
    furthest = [0]
    memo = {}

    def matches(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        furthest[0] = max(furthest[0], i)
        if i == len(patterns):
            result = j == len(printed)
        elif patterns[i] is None:
            result = any(matches(i + 1, k) for k in range(j, len(printed) + 1))
        else:
            result = j < len(printed) and bool(patterns[i].match(printed[j])) and matches(i + 1, j + 1)
        memo[(i, j)] = result
        return result

    if matches(0, 0):
        return None
    if furthest[0] >= len(shown):
        return "the command printed more lines than the page shows (end the block with '...')"
    return f"no printed line where the page shows: {shown[furthest[0]]!r}"

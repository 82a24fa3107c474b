#!/usr/bin/python3
"""Checks that every #include "ROOM/..." of the code stays within the layers: a file of one room
may include its own room and the rooms it depends on (directly or through them), nothing above.
The build runs it before compiling (meson.build, `rooms`); a violation fails the build with one
line per offending include.

usage: check_layers.py SOURCE_ROOT STAMP ROOM=DIRECTORY:DEPENDENCY,DEPENDENCY ...
Writes STAMP (an empty header the libraries wait for) when every include is allowed."""
import os
import re
import sys

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"/]+)/[^"]+"', re.MULTILINE)
SOURCES = (".cpp", ".hpp", ".h", ".cu", ".cuh")


def parse_rooms(arguments):
    rooms = {}
    for argument in arguments:
        name, _, rest = argument.partition("=")
        directory, _, dependencies = rest.partition(":")
        rooms[name] = (directory, [d for d in dependencies.split(",") if d])
    return rooms


def reachable(rooms, room):
    """The rooms `room` may include: itself and everything its dependencies reach."""
    seen, pending = set(), [room]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        pending.extend(rooms[current][1])
    return seen


def violations(root, rooms):
    for room, (directory, _) in sorted(rooms.items()):
        allowed = reachable(rooms, room)
        for folder, _, files in os.walk(os.path.join(root, directory)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
                for match in INCLUDE.finditer(text):
                    target = match.group(1)
                    if target in rooms and target not in allowed:
                        line = text.count("\n", 0, match.start()) + 1
                        yield (f"{os.path.relpath(path, root)}:{line}: includes \"{target}/...\", but the "
                               f"{room} room may include only {', '.join(sorted(allowed))} "
                               f"(rooms in meson.build)")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root, stamp = sys.argv[1], sys.argv[2]
    rooms = parse_rooms(sys.argv[3:])
    unknown = {d for _, dependencies in rooms.values() for d in dependencies} - set(rooms)
    if unknown:
        sys.exit(f"check_layers: unknown room(s) {', '.join(sorted(unknown))}")
    found = list(violations(root, rooms))
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        sys.exit(1)
    with open(stamp, "w") as handle:
        handle.write("// Every include of the code stays within its layers (scripts/build/check_layers.py).\n")


if __name__ == "__main__":
    main()

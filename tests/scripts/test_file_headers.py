"""Every source file opens with a comment saying what it is for, and the files that comment names
exist: a header that sends a reader to a renamed file ("(see run_report.hpp)") sends them nowhere.
A name is held against the file's folder, the rooms' roots and the source root."""
import os
import re
import subprocess
import unittest

SOURCE = os.path.abspath(os.environ.get("MLPTRAIN_SOURCE", os.path.join(os.path.dirname(__file__), "..", "..")))
FOLDERS = ("src", "kernels", "strategies", "data", "tests")
SUFFIXES = (".cpp", ".hpp", ".cu", ".cuh")
ROOTS = ("", "src", "kernels", "strategies")
NAMED = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.(?:hpp|cpp|cuh|cu|py|sh))(?![\w.])")


def header(text):
    """The comment lines a file opens with."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        lines.append(line)
    return "\n".join(lines)


def unresolved(path, text):
    folder = os.path.dirname(path)
    return [name for name in NAMED.findall(header(text))
            if not any(os.path.exists(os.path.join(SOURCE, root, name)) for root in (folder,) + ROOTS)]


class FileHeaders(unittest.TestCase):
    def test_every_source_file_says_what_it_is_for_and_names_files_that_exist(self):
        listed = subprocess.run(["git", "ls-files", *FOLDERS], cwd=SOURCE, capture_output=True, text=True)
        files = [path for path in listed.stdout.split() if path.endswith(SUFFIXES)]
        if listed.returncode != 0 or not files:
            self.skipTest("not a git checkout: no list of the tree's files")
        problems = []
        for path in files:
            with open(os.path.join(SOURCE, path), errors="replace") as handle:
                text = handle.read()
            if not header(text):
                problems.append(f"{path}: no opening comment")
            problems += [f"{path}: its header names {name}, which does not exist" for name in unresolved(path, text)]
        self.assertEqual(problems, [])

    def test_a_stale_name_is_found(self):
        self.assertEqual(unresolved("src/train/x.cpp", "// The run (see no_such_file.hpp).\n#include <x>\n"),
                         ["no_such_file.hpp"])
        self.assertEqual(unresolved("src/train/x.cpp", "// The loop (see trainer.hpp, train/run.hpp).\n"), [])


if __name__ == "__main__":
    unittest.main()

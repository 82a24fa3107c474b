"""The README and the pages under docs/ against the code: the README stays a front door (at most
200 lines); every relative link, and every #anchor into a Markdown file, resolves; every --flag
written in code is an option of mlptrain, mlpplan or commbench, a flag of a script under
scripts/, or one of the few external tools' flags named here; every scripts/NAME named exists.
Each check also runs on a page with a planted error, to show that it can fail."""
import os
import re
import subprocess
import unittest

from common import MLPTRAIN, SOURCE_ROOT

BUILD = os.path.dirname(os.path.abspath(MLPTRAIN))
README_MOST_LINES = 200
# Flags of a program the pages launch that is not the project's (Slurm's srun).
EXTERNAL_FLAGS = {"--mpi", "--ntasks-per-node"}


def read(path):
    with open(path, encoding="utf-8") as file:
        return file.read()


def pages():
    """The README, results/README.md and every page under docs/, as (relative path, text)."""
    paths = ["README.md", os.path.join("results", "README.md")]
    docs = os.path.join(SOURCE_ROOT, "docs")
    paths += sorted(os.path.join("docs", name) for name in os.listdir(docs) if name.endswith(".md"))
    return [(path, read(os.path.join(SOURCE_ROOT, path))) for path in paths]


def slug(heading):
    """GitHub's anchor of a heading: lowercase, punctuation but hyphens and underscores dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text):
    found = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def broken_links(path, text):
    """Relative links of `text` (a page at `path`) whose file or anchor does not exist."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute address
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(SOURCE_ROOT, os.path.dirname(path), file_part)) if file_part \
            else os.path.join(SOURCE_ROOT, path)
        if not os.path.exists(resolved):
            problems.append(f"{path}: link to missing {target}")
        elif anchor and resolved.endswith(".md"):
            if anchor not in anchors(read(resolved)):
                problems.append(f"{path}: link to missing heading {target}")
    return problems


def code_spans(text):
    """(line number, code) of every code span and fenced code line."""
    spans, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            spans.append((number, line))
        else:
            spans += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
    return spans


def known_flags():
    """Every flag the project's programs and scripts accept."""
    flags = set(EXTERNAL_FLAGS)
    for program in ("mlptrain", "mlpplan", "commbench"):
        help_text = subprocess.run([os.path.join(BUILD, program), "--help"], capture_output=True, text=True).stdout
        flags |= set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))
    for folder, _, names in os.walk(os.path.join(SOURCE_ROOT, "scripts")):
        for name in names:
            if name.endswith(".py"):
                flags |= set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", read(os.path.join(folder, name))))
    return flags


def unknown_flags(path, text, flags):
    problems = []
    for number, code in code_spans(text):
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(?![\w-])", code):
            if flag not in flags:
                problems.append(f"{path}:{number}: {flag} is no option of the programs or scripts")
    return problems


def missing_scripts(path, text):
    return [f"{path}: {name} does not exist" for name in set(re.findall(r"\bscripts/[\w.]+\.(?:py|sh)\b", text))
            if not os.path.exists(os.path.join(SOURCE_ROOT, name))]


class Docs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pages = pages()
        cls.flags = known_flags()

    def test_the_readme_is_a_front_door(self):
        readme = dict(self.pages)["README.md"]
        self.assertLessEqual(len(readme.splitlines()), README_MOST_LINES)
        self.assertIn("scripts/run.sh", readme)
        self.assertIn("scripts/test.sh", readme)

    def test_every_link_resolves(self):
        problems = [problem for path, text in self.pages for problem in broken_links(path, text)]
        self.assertEqual(problems, [])
        self.assertEqual(len(broken_links("docs/x.md", "[a](layouts.md#no-such-heading) [b](../nothing.md)")), 2)

    def test_every_flag_is_an_option_somewhere(self):
        self.assertIn("--zero-shard-size", self.flags)  # a strategy's own option reaches --help
        problems = [problem for path, text in self.pages for problem in unknown_flags(path, text, self.flags)]
        self.assertEqual(problems, [])
        self.assertEqual(len(unknown_flags("x.md", "run `mlptrain --tensor-parallel 2`", self.flags)), 1)

    def test_every_named_script_exists(self):
        problems = [problem for path, text in self.pages for problem in missing_scripts(path, text)]
        self.assertEqual(problems, [])
        self.assertEqual(len(missing_scripts("x.md", "see scripts/no_such_script.py")), 1)


if __name__ == "__main__":
    unittest.main()

"""The README and the pages under docs/ (and, for links, under results/) against the code: the
README stays a front door (at most 200 lines); every relative link, and every #anchor into a
Markdown file, resolves; every --flag written in code is an option of mlptrain, mlpplan or
commbench, a flag of a script under scripts/, or one of the few external tools' flags named here;
every scripts/NAME named exists. And the pages run: every command block of the README and of
docs/ runs and succeeds (shortened as doc_runs.py says) or is marked with the reason it cannot
run here, and every transcript prints what the page shows (doc_pages.py says how a page writes
that). Each check also runs on a page with a planted error, to show that it can fail."""
import json
import os
import re
import subprocess
import unittest

from common import MLPTRAIN, SOURCE_ROOT
from doc_pages import blocks, mismatch, pages as markdown_pages, read, stray_markers, transcript
from doc_runs import Sandbox, substitute

BUILD = os.path.dirname(os.path.abspath(MLPTRAIN))
README_MOST_LINES = 200
# Flags of a program the pages launch that is not the project's (Slurm's srun).
# srun's, and sbatch's in docs/clusters.md's batch script.
EXTERNAL_FLAGS = {"--mpi", "--ntasks-per-node", "--job-name", "--ntasks", "--time", "--requeue", "--signal",
                  "--open-mode"}


def pages():
    """The README and every page under docs/ (the pages whose commands run), as (path, text)."""
    return markdown_pages(SOURCE_ROOT, folders=("docs",))


def pages_with_results():
    """Those and every page under results/ (held to their links)."""
    return markdown_pages(SOURCE_ROOT, folders=("docs", "results"))


def slug(heading):
    """GitHub's anchor of a heading: lowercase, punctuation but hyphens and underscores dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text):
    found = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
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
        if line.lstrip().startswith("```"):
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


def option_table(text):
    """docs/options.md's table: option name -> (group, its default as the table gives it)."""
    options, group = {}, None
    for line in text.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] if line.startswith("| ") else []
        if len(cells) != 4 or cells[0] in ("group", "---"):
            continue
        group = cells[0] or group
        names = [name for span in re.findall(r"`([^`]*)`", cells[1]) for name in re.findall(r"--([a-z][a-z0-9-]*)", span)]
        defaults = cells[2].split(", ") if len(cells[2].split(", ")) == len(names) else [cells[2]] * len(names)
        for name, default in zip(names, defaults):
            options[name] = (group, default)
    return options


def default_word(text):
    """A default as a word to compare: its first word, numbers as numbers, a switch as on or off."""
    word = text.split(" ")[0].rstrip(":") if text else ""
    word = {"false": "off", "true": "on"}.get(word, word)
    try:
        return float(word)
    except ValueError:
        return word


PYTHON = "/usr/bin/python3"  # the one scripts/build/setup.sh installs numpy, h5py and matplotlib for
COMMAND_STARTS = ("mpiexec", "build/", "scripts/", "/usr/bin/python3", "h5ls", "h5dump", "apt-get")


def other_pythons(path, text):
    """Code on a page that calls a Python other than PYTHON (whichever `python3` is first on the
    PATH may lack the packages the scripts import)."""
    return [f"{path}:{number}: calls {match.group(0)!r}; call {PYTHON}" for number, code in code_spans(text)
            for match in re.finditer(r"(?<![/\w])python3?(?= )", code)]


def unlabelled_commands(path, text):
    """Blocks that hold commands but are neither labelled sh nor a transcript: the test would not
    run them."""
    return [f"{block.where}: commands in a block that is neither sh nor a transcript" for block in blocks(path, text)
            if not block.is_commands and not block.is_transcript and block.lines
            and block.lines[0].lstrip().startswith(COMMAND_STARTS)]


def run_page(path, text):
    """Runs a page's blocks in order in a sandbox; returns the problems: a commands block that
    fails, a transcript whose command prints other lines than the page shows."""
    problems = []
    sandbox = Sandbox(BUILD, SOURCE_ROOT)
    try:
        for block in blocks(path, text):
            if block.skip is not None:
                continue
            if block.is_commands:
                code, output = sandbox.run(substitute("\n".join(block.lines)))
                if code != 0:
                    problems.append(f"{block.where}: exit code {code}:\n{output[-3000:]}")
            elif block.is_transcript:
                for command, shown in transcript(block.lines):
                    _, output = sandbox.run(command)
                    difference = mismatch(shown, output.splitlines())
                    if difference:
                        problems.append(f"{block.where}: $ {command}: {difference}; it printed:\n{output[-3000:]}")
    finally:
        sandbox.close()
    return problems


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
        problems = [problem for path, text in pages_with_results() for problem in broken_links(path, text)]
        self.assertEqual(problems, [])
        self.assertEqual(len(broken_links("docs/x.md", "[a](layouts.md#no-such-heading) [b](../nothing.md)")), 2)

    def test_every_flag_is_an_option_somewhere(self):
        self.assertIn("--zero-shard-size", self.flags)  # a strategy's own option reaches --help
        problems = [problem for path, text in self.pages for problem in unknown_flags(path, text, self.flags)]
        self.assertEqual(problems, [])
        self.assertEqual(len(unknown_flags("x.md", "run `mlptrain --tensor-parallel 2`", self.flags)), 1)

    def test_the_option_table_is_the_programs(self):
        """docs/options.md's table names every option of mlptrain in its group, and no other, with
        the program's default (a row of several options gives one default each, or one for all;
        a default is held by its first word: "0 (none)" is 0, "off" is false)."""
        listed = [json.loads(line) for line in subprocess.run([os.path.join(BUILD, "mlpplan"), "--list", "options", "--json"],
                                                              capture_output=True, text=True, check=True).stdout.splitlines()]
        programs = {row["name"]: (row["section"].lower(), row["default"]) for row in listed}
        documented = option_table(read(os.path.join(SOURCE_ROOT, "docs", "options.md")))
        self.assertEqual(sorted(documented), sorted(programs))
        for name, (group, default) in documented.items():
            self.assertEqual(group, programs[name][0], f"--{name}")
            self.assertEqual(default_word(default), default_word(programs[name][1]), f"--{name}: {default!r}")

    def test_every_named_script_exists(self):
        problems = [problem for path, text in self.pages for problem in missing_scripts(path, text)]
        self.assertEqual(problems, [])
        self.assertEqual(len(missing_scripts("x.md", "see scripts/no_such_script.py")), 1)

    def test_every_block_runs_or_says_why_not(self):
        """Each page's blocks run in order; a commands block must succeed, a transcript print what
        the page shows. Every block is one or the other, or marked with its reason, or a figure
        (no sh label, no "$ ")."""
        for path, text in self.pages:
            self.assertEqual(stray_markers(path, text), [])
            with self.subTest(page=path):
                self.assertEqual(run_page(path, text), [])

    def test_one_python(self):
        """Pages call /usr/bin/python3, and scripts run under it (their first line)."""
        problems = [problem for path, text in pages_with_results() for problem in other_pythons(path, text)]
        for folder, _, names in os.walk(os.path.join(SOURCE_ROOT, "scripts")):
            for name in names:
                path = os.path.join(folder, name)
                if name.endswith(".py") and read(path).startswith("#!") and not read(path).startswith(f"#!{PYTHON}\n"):
                    problems.append(f"{path}: its first line is not #!{PYTHON}")
        self.assertEqual(problems, [])
        self.assertEqual(len(other_pythons("x.md", "run `python3 scripts/tools/commbench_plot.py x`")), 1)

    def test_every_block_with_commands_is_run(self):
        problems = [problem for path, text in self.pages for problem in unlabelled_commands(path, text)]
        self.assertEqual(problems, [])
        self.assertEqual(len(unlabelled_commands("x.md", "```\nmpiexec.mpich -n 2 build/mlptrain\n```\n")), 1)

    def test_a_failing_block_and_a_stale_transcript_are_caught(self):
        page = "\n".join(["```sh", "build/mlptrain --no-such-option", "```",
                          "<!-- docs-test: skip: needs what is not here -->", "```sh", "false", "```",
                          "```", "$ build/mlpplan --world 3", "mlpplan: something else", "```"])
        problems = run_page("planted.md", page)
        self.assertEqual([problem.split(":")[1] for problem in problems], ["1", "8"], problems)
        self.assertEqual(stray_markers("x.md", "<!-- docs-test: skip: why -->\ntext\n"),
                         ["x.md:1: a docs-test marker above no code block"])

    def test_what_a_transcript_matches(self):
        printed = ["header", "step 1  12.5 ms", "step 2  11.0 ms", "summary: final loss 0.25"]
        self.assertIsNone(mismatch(["header", "...", "summary: final loss 0.25"], printed))
        self.assertIsNone(mismatch(["...", "step 2  … ms", "..."], printed))
        self.assertIsNotNone(mismatch(["...", "summary: final loss 0.26"], printed))
        self.assertIsNotNone(mismatch(["header", "step 1  … ms"], printed))  # lines left over
        self.assertIsNotNone(mismatch(["step 1  … ms", "..."], printed))     # not the first line
        self.assertIsNotNone(mismatch(["...", "step 2 … ms", "header", "..."], printed))  # order


if __name__ == "__main__":
    unittest.main()

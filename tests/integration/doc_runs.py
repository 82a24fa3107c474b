"""Running a page's blocks as its reader would: in a fresh directory holding `build` (the build
under test) and `scripts` (the source tree's), the page's blocks one after another, so that a
block may use what an earlier one wrote.

A transcript runs exactly as written; its output is compared. A commands block runs as written
but for these substitutions, which keep the suite short without changing what a command does:
  * every step count of mlptrain (--steps, --save-every, --eval-every, --log-every,
    --warmup-steps) is divided by 20, rounded up; a run without --steps gets --steps 5 (its
    default of 100, divided alike);
  * commbench measures up to --max-bytes 1M (appended where the command sets no larger limit,
    replacing a larger one);
  * `apt-get install [-y] PACKAGES` becomes a check that the packages are installed
    (scripts/build/setup.sh installs the ones the pages use)."""
import math
import os
import re
import subprocess
import tempfile

STEP_DIVISOR = 20
STEP_OPTIONS = ("--steps", "--save-every", "--eval-every", "--log-every", "--warmup-steps")
DEFAULT_STEPS = 100
COMMBENCH_MOST_BYTES = 1 << 20
SIZE_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
BLOCK_TIME_LIMIT_S = 300


def shorten_steps(command):
    """An mlptrain command with its step counts divided (see the module's text)."""
    def divided(match):
        return f"{match.group(1)} {max(1, math.ceil(int(match.group(2)) / STEP_DIVISOR))}"
    command = re.sub(r"(--(?:steps|save-every|eval-every|log-every|warmup-steps))[ =](\d+)", divided, command)
    if "--steps" not in command and "--help" not in command:
        command = append_arguments(command, f"--steps {math.ceil(DEFAULT_STEPS / STEP_DIVISOR)}")
    return command


def shorten_sizes(command):
    """A commbench command measuring up to COMMBENCH_MOST_BYTES."""
    limit = re.search(r"--max-bytes[ =](\d+)([KMG]?)", command)
    if limit and int(limit.group(1)) * SIZE_SUFFIX[limit.group(2)] <= COMMBENCH_MOST_BYTES:
        return command
    if limit:
        return command.replace(limit.group(0), f"--max-bytes {COMMBENCH_MOST_BYTES}")
    return append_arguments(command, f"--max-bytes {COMMBENCH_MOST_BYTES}")


def append_arguments(command, arguments):
    """The command with arguments added before its redirection or comment, if any."""
    split = re.search(r"\s+(?:[0-9]?>|\||#|&&)", command)
    at = split.start() if split else len(command.rstrip())
    return command[:at] + " " + arguments + command[at:]


def check_packages(command):
    """`apt-get install [-y] PACKAGES` as a check that they are installed."""
    def check(match):
        packages = " ".join(word for word in match.group(1).split() if not word.startswith("-"))
        return (f"for package in {packages}; do dpkg-query -W -f='${{Status}}' $package 2>/dev/null | "
                f"grep -q 'install ok installed'; done")
    return re.sub(r"\bapt-get install((?:\s+[\w.+-]+)+)", check, command)


def substitute(text):
    """A commands block's text with the substitutions applied, line by line (a command continued
    with a backslash is one line here)."""
    logical = re.sub(r"\\\n\s*", " ", text)
    lines = []
    for line in logical.splitlines():
        line = check_packages(line)
        if "build/mlptrain" in line:
            line = shorten_steps(line)
        if "build/commbench" in line:
            line = shorten_sizes(line)
        lines.append(line)
    return "\n".join(lines) + "\n"


class Sandbox:
    """A fresh directory holding `build` and `scripts` as links, where a page's blocks run."""

    def __init__(self, build, source_root):
        self.directory = tempfile.TemporaryDirectory(prefix="mlptrain_docs_")
        os.symlink(build, os.path.join(self.directory.name, "build"))
        os.symlink(os.path.join(source_root, "scripts"), os.path.join(self.directory.name, "scripts"))

    def run(self, text):
        """(exit code, stdout and stderr together) of a shell text run with bash -e."""
        environment = dict(os.environ, OMP_NUM_THREADS="1")
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=self.directory.name,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=BLOCK_TIME_LIMIT_S, env=environment)
        return result.returncode, result.stdout

    def close(self):
        self.directory.cleanup()

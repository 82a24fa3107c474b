"""Whether mlptrain accepts a layout, asked of the program instead of re-coded here: mlpplan takes
mlptrain's options and validates them exactly as mlptrain does (the same rules, the same line),
for any world size and without launching anything."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def planner():
    """mlpplan beside the mlptrain the scripts run (MLPTRAIN, else the build folder's)."""
    trainer = os.environ.get("MLPTRAIN", os.path.join(ROOT, "build", "mlptrain"))
    return os.path.join(os.path.dirname(os.path.abspath(trainer)), "mlpplan")


def layout_problem(world, options):
    """None when mlptrain accepts `options` on `world` ranks, else its one line saying why not."""
    result = subprocess.run([planner(), "--world", str(world)] + [str(option) for option in options],
                            capture_output=True, text=True)
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else f"mlpplan exited with {result.returncode}"

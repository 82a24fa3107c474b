#!/usr/bin/python3
"""mlpplan's plan of the GPU step against the step bench.py measured on the same GPU: reads
check.sh's planner_<precision>.json (mlpplan --json calibrated from layerbench's --device cuda
rows) and bench.py's step.json from one results folder, and writes plan_vs_measured.json there:
per precision the planned step and its parts, the measured step, and their ratio (goal: within
10 %).

usage: scripts/gpu/plan_vs_step.py RESULTS_DIR"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
from benchlib import write_result  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    try:
        with open(os.path.join(folder, "step.json")) as handle:
            measured = json.load(handle)
    except (OSError, ValueError) as error:
        sys.exit(f"plan_vs_step: {os.path.join(folder, 'step.json')}: {error} (run bench.py --parts step first)")
    precisions = {}
    for precision in ("fp32", "tf32", "bf16"):
        path = os.path.join(folder, f"planner_{precision}.json")
        if not measured.get(precision, {}).get("step_ms") or not os.path.exists(path):
            continue  # not measured, or refused (a run whose model did not train gives no figure)
        with open(path) as handle:
            planned = json.loads(handle.readline())["step_ms"]
        step_ms = measured[precision]["step_ms"]
        precisions[precision] = {"planned_ms": planned, "measured_ms": step_ms,
                                 "planned_over_measured": planned["total"] / step_ms}
        print(f"plan_vs_step: {precision} planned {planned['total']:.1f} ms, measured {step_ms:.1f} ms "
              f"({planned['total'] / step_ms:.2f})", flush=True)
    if not precisions:
        sys.exit(f"plan_vs_step: no precision has both a plan and a measured step in {folder}")
    write_result(os.path.join(folder, "plan_vs_measured.json"),
                 {"model": measured.get("model"), "goal": "planned within 10 % of measured", "precisions": precisions})


if __name__ == "__main__":
    main()

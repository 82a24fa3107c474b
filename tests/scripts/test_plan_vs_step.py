"""scripts/gpu/plan_vs_step.py, the GPU planner's check: mlpplan's plans (one JSON line each, as
check.sh's planner phase writes them) beside bench.py's measured steps, each precision's ratio
written to plan_vs_measured.json; a precision without both is left out, and a folder without a
measured step is refused with one line."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.environ.get("MLPTRAIN_SOURCE", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "scripts", "gpu", "plan_vs_step.py")


class PlanVsStep(unittest.TestCase):
    def test_each_precisions_plan_over_its_measured_step(self):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "step.json"), "w") as handle:
                json.dump({"model": {"layers": 16}, "fp32": {"step_ms": 1000.0}, "bf16": {"step_ms": 80.0},
                           "tf32": {"step_ms": 170.0}}, handle)
            for precision, total in (("fp32", 950.0), ("bf16", 72.0)):  # no TF32 plan
                with open(os.path.join(folder, f"planner_{precision}.json"), "w") as handle:
                    handle.write(json.dumps({"step_ms": {"total": total, "compute": total}}) + "\n")
            subprocess.run([sys.executable, SCRIPT, folder], check=True, capture_output=True, text=True)
            with open(os.path.join(folder, "plan_vs_measured.json")) as handle:
                result = json.load(handle)["precisions"]
            self.assertEqual(sorted(result), ["bf16", "fp32"])
            self.assertAlmostEqual(result["fp32"]["planned_over_measured"], 0.95)
            self.assertAlmostEqual(result["bf16"]["planned_over_measured"], 0.9)

    def test_a_folder_without_a_measured_step_is_refused(self):
        with tempfile.TemporaryDirectory() as folder:
            result = subprocess.run([sys.executable, SCRIPT, folder], capture_output=True, text=True)
            self.assertNotEqual(result.returncode, 0)
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
            self.assertIn("step.json", result.stderr)


if __name__ == "__main__":
    unittest.main()

"""scripts/bench/benchlib.py's measure of a round's share of the machine: a child that computes
gets more of it than one that sleeps; rounds with markedly less than the best round's share
(below 0.85 of it) are set aside, the rest kept in order. A run history gets a line a run, numbered,
with the date, machine and tree that made it."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.environ.get("MLPTRAIN_SOURCE", os.path.join(os.path.dirname(__file__), "..", "..")),
                                "scripts", "bench"))
import benchlib  # noqa: E402


def child(code):
    return lambda: subprocess.run([sys.executable, "-c", code], check=True)


class CpuShare(unittest.TestCase):
    def test_a_busy_child_gets_more_than_a_sleeping_one(self):
        """Both start Python (a few tens of ms of CPU); then one computes for 0.5 s and one sleeps.
        The busy one's share depends on what else the host runs, so the test compares the two."""
        _, busy = benchlib.with_cpu_share(child("import time\nend = time.time() + 0.5\nwhile time.time() < end: pass"),
                                          cores=1)
        _, idle = benchlib.with_cpu_share(child("import time; time.sleep(0.5)"), cores=1)
        self.assertGreater(busy, 2 * idle)
        self.assertLessEqual(busy, 1.05)

    def test_rounds_with_markedly_less_share_are_set_aside(self):
        kept, set_aside = benchlib.quiet_rounds([10.0, 31.0, 11.0, 10.5], [0.95, 0.40, 0.90, 0.80])
        self.assertEqual(kept, [10.0, 11.0])
        self.assertEqual(set_aside, [1, 3])
        kept, set_aside = benchlib.quiet_rounds([5.0, 6.0], [0.5, 0.5])
        self.assertEqual((kept, set_aside), ([5.0, 6.0], []))


class LedgerDisagreements(unittest.TestCase):
    PLAN = {"memory_bytes": {"params": 100, "grads": 100}, "comm_bytes_per_step": {"all_reduce": 1000, "all_to_all": 800}}

    def summary(self, grads, all_reduce, all_to_all):
        return {"placement": {"params": {"measured_bytes": 100}, "grads": {"measured_bytes": grads}},
                "comm_per_step": {"all_reduce": {"measured_bytes": all_reduce},
                                  "all_to_all": {"measured_bytes": all_to_all}}}

    def test_states_exact_bytes_within_one_percent_routed_within_a_quarter(self):
        states = ("params", "grads")
        self.assertEqual(benchlib.ledger_disagreements(self.PLAN, self.summary(100, 1005, 800), states), [])
        self.assertEqual(benchlib.ledger_disagreements(self.PLAN, self.summary(101, 1000, 800), states),
                         ["grads: planned 100, measured 101"])
        self.assertEqual(len(benchlib.ledger_disagreements(self.PLAN, self.summary(100, 1020, 700), states)), 2)
        self.assertEqual(benchlib.ledger_disagreements(self.PLAN, self.summary(100, 1000, 700), states,
                                                       routed_ops=("all_to_all",)), [])


if __name__ == "__main__":
    unittest.main()


class RunHistory(unittest.TestCase):
    def test_each_run_is_one_numbered_line_with_its_date_machine_and_tree(self):
        import json
        import tempfile
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "history.jsonl")
            self.assertEqual(benchlib.append_result(path, {"summary": {"figure": 1}}), 1)
            self.assertEqual(benchlib.append_result(path, {"summary": {"figure": 2}}), 2)
            with open(path) as handle:
                runs = [json.loads(line) for line in handle]
        self.assertEqual([(run["run"], run["summary"]["figure"]) for run in runs], [(1, 1), (2, 2)])
        for run in runs:
            self.assertTrue({"date", "machine", "cpu", "command", "tree"} <= set(run), run)

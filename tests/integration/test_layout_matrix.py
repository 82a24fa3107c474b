"""The layout matrix's tested subset (scripts/layout_matrix.py --covering): every pair of values of
dp, tp, pp with each schedule, ep, ZeRO 0-3, recomputation and MoE layers up to 4 ranks, and at 8
ranks dp 2 x tp 2 x pp 2 and dp 4 (ep 2) x tp 2 with MoE layers, each against one process within 1e-5 with its
placement and traffic as predicted. The full matrix is the script's, its result kept in
results/layout_matrix.json."""
import unittest

import common  # noqa: F401  (puts scripts/ on the path)
import layout_matrix  # noqa: E402


class LayoutMatrix(unittest.TestCase):
    def test_covering_subset_matches_one_process(self):
        candidates = layout_matrix.layouts()
        chosen = layout_matrix.tested_subset(candidates)
        self.assertIn(layout_matrix.THREE_D, candidates)
        self.assertIn(layout_matrix.MOE_THREE_D, candidates)
        for row in layout_matrix.run_matrix(chosen, progress=lambda line: None):
            with self.subTest(**{factor: row[factor] for factor in layout_matrix.FACTORS}):
                self.assertEqual(row["outcome"], "passed", row.get("line") or row.get("problems"))


if __name__ == "__main__":
    unittest.main()

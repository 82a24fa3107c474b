"""The layout matrix's tested subset (scripts/experiments/layout_matrix.py --covering): every pair of values of
dp, tp, pp with each schedule, ep, ZeRO 0-3, recomputation and MoE layers up to 4 ranks, and at 8
ranks dp 2 x tp 2 x pp 2 and dp 4 (ep 2) x tp 2 with MoE layers, each against one process within 1e-5 with its
placement and traffic as predicted. The full matrix is the script's, its result kept in
results/layout_matrix.json. The enumeration keeps exactly the candidates mlptrain's validation
(asked of mlpplan) accepts, and a refused layout is named with mlpplan's line."""
import itertools
import unittest

import common  # noqa: F401  (puts scripts/ on the path)
import layout_matrix  # noqa: E402
from benchlib import layout_problem  # noqa: E402


def layout(world, dp, tp=1, pp=1, ep=1, zero=0, schedule=None, recompute=False, moe=False):
    """A layout as layout_matrix.layouts() writes it, the factors not named at their plainest."""
    return dict(world=world, dp=dp, tp=tp, pp=pp, ep=ep, zero=zero, schedule=schedule, recompute=recompute, moe=moe)


def problem(candidate):
    """mlpplan's answer for the one candidate, as a run of the matrix would give its options."""
    return layout_problem(candidate["world"], sum(layout_matrix.arguments(candidate), []))


class LayoutEnumeration(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.layouts = layout_matrix.layouts()

    def test_the_enumeration_keeps_what_each_layouts_own_validation_accepts(self):
        # One mlpplan call per world lists the valid layouts; each candidate asked alone must agree
        # (every candidate at 2 ranks, a spread of them at 4 and 8: thousands of launches otherwise).
        chosen = list(layout_matrix.candidates(2)) + list(itertools.chain.from_iterable(
            itertools.islice(layout_matrix.candidates(world), 0, None, 23) for world in (4, 8)))
        self.assertGreater(sum(candidate in self.layouts for candidate in chosen), 20)
        for candidate in chosen:
            with self.subTest(**candidate):
                line = problem(candidate)
                self.assertEqual(candidate in self.layouts, line is None, line)

    def test_hand_checked_layouts(self):
        for accepted in (layout(1, 1), layout(4, 4, ep=4, zero=3, recompute=True, moe=True),
                         layout(8, 1, tp=2, pp=4, schedule="gpipe", moe=True),
                         layout(8, 1, tp=8, recompute=True), layout_matrix.THREE_D, layout_matrix.MOE_THREE_D):
            with self.subTest(**accepted):
                self.assertIn(accepted, self.layouts)
        refusals = {"world size 8": layout(8, 2, tp=2),  # dp x tp x pp is not the world
                    "--ep 4 does not divide dp 2": layout(8, 2, tp=2, pp=2, ep=4, schedule="1f1b", moe=True),
                    "it needs --moe-every": layout(2, 2, ep=2)}
        for line, refused in refusals.items():
            with self.subTest(**refused):
                self.assertNotIn(refused, self.layouts)
                self.assertRegex(problem(refused), f"^mlpplan: error: .*{line}")
        # The matrix's own choices leave out layouts mlptrain accepts: ZeRO without a data-parallel
        # group to shard over, and a schedule without a pipeline.
        for left_out in (layout(2, 1, tp=2, zero=1), layout(2, 2, schedule="gpipe")):
            with self.subTest(**left_out):
                self.assertNotIn(left_out, self.layouts)
                self.assertIsNone(problem(left_out))
        self.assertEqual(len(self.layouts), len({tuple(sorted(entry.items())) for entry in self.layouts}))


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

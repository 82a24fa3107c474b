"""The equivalence checks over the network transport, as between nodes: MPICH told that no rank is
local (MPIR_CVAR_NOLOCAL=1), UCX over TCP, and no shared-memory windows, so every collective and
transfer crosses a socket. Every layout still reproduces the one-process run.

UCX 1.13's TCP transport can hang in MPI_Finalize after all the work is done (openucx/ucx#8738:
it stops progressing endpoints another rank is still flushing; a bare MPI_Init, MPI_Allreduce,
MPI_Finalize program does the same). mlptrain's teardown guard then ends each rank 10 s after the
work, and mpiexec may call that a failure: every run here must end by itself, and one that exits
non-zero counts only if the guard says why, its summary and final checkpoint written."""
import os
import subprocess
import unittest

from common import MLPTRAIN, MPIEXEC, TrainingTestCase, read_checkpoint, read_metrics
from benchlib import ended_in_teardown  # noqa: E402  (common puts scripts/bench on the path)

NETWORK = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp", "MLPTRAIN_SHARED_MEMORY": "0"}
BASE = ["--dataset", "mixture", "--shuffle", "--layers", "6", "--hidden", "16", "--input-dim", "10",
        "--output-dim", "5", "--global-batch", "24", "--micro-batches", "2", "--lr", "3e-3",
        "--grad-clip", "0.05", "--steps", "8", "--log-every", "0"]
RUN_TIME_LIMIT_S = 60  # the work takes 1-2 s, a hung teardown 10 s more


class Network(TrainingTestCase):
    def train_over_tcp(self, name, arguments, ranks):
        metrics = self.path(name + ".jsonl")
        checkpoints = self.path(name)
        result = subprocess.run([MPIEXEC, "-n", str(ranks), MLPTRAIN] + [str(a) for a in arguments] +
                                ["--metrics", metrics, "--checkpoint-dir", checkpoints],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                timeout=RUN_TIME_LIMIT_S, env=dict(os.environ, OMP_NUM_THREADS="1", **NETWORK))
        if result.returncode != 0:
            summary_written = os.path.exists(metrics) and read_metrics(metrics)[1] is not None
            self.assertTrue(ended_in_teardown(result.stderr, summary_written), result.stderr)
            print(f"{name}: the work finished, MPI_Finalize hung over UCX/TCP (openucx/ucx#8738) and the guard "
                  f"ended it")
        steps, _ = read_metrics(metrics)
        with open(os.path.join(checkpoints, "latest")) as handle:
            return steps, read_checkpoint(os.path.join(checkpoints, handle.read().strip()))

    def test_layouts_over_tcp(self):
        reference_steps, _, reference = self.train("one", BASE, 1)
        for ranks, extra in ((2, []), (2, ["--zero", "2"]), (4, ["--tp", "2", "--zero", "1"]),
                             (4, ["--pp", "2", "--dp", "2", "--zero", "3"])):
            with self.subTest(ranks=ranks, extra=extra):
                steps, tensors = self.train_over_tcp(f"tcp{ranks}{len(extra)}", BASE + extra, ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)


if __name__ == "__main__":
    unittest.main()

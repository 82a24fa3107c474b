"""The equivalence checks over the network transport, as between nodes: MPICH told that no rank is
local (MPIR_CVAR_NOLOCAL=1), UCX over TCP, and no shared-memory windows, so every collective and
transfer crosses a socket. Every layout still reproduces the one-process run.

UCX 1.13's TCP transport can hang in MPI_Finalize after all the work is done (openucx/ucx#8738:
it stops progressing endpoints another rank is still flushing; a bare MPI_Init, MPI_Allreduce,
MPI_Finalize program does the same). A run that hangs there, with its summary and final
checkpoint already written, is ended and checked like any other; one that hangs earlier fails."""
import os
import signal
import subprocess
import unittest

from common import MLPTRAIN, MPIEXEC, TrainingTestCase, rank_processes, read_checkpoint, read_metrics

NETWORK = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp", "MLPTRAIN_SHARED_MEMORY": "0"}
BASE = ["--dataset", "mixture", "--shuffle", "--layers", "6", "--hidden", "16", "--input-dim", "10",
        "--output-dim", "5", "--global-batch", "24", "--micro-batches", "2", "--lr", "3e-3",
        "--grad-clip", "0.05", "--steps", "8", "--log-every", "0"]
WORK_TIME_LIMIT_S = 30  # far beyond what these runs need (1-2 s); only the teardown may be cut short


class Network(TrainingTestCase):
    def train_over_tcp(self, name, arguments, ranks):
        metrics = self.path(name + ".jsonl")
        checkpoints = self.path(name)
        launcher = subprocess.Popen([MPIEXEC, "-n", str(ranks), MLPTRAIN] + [str(a) for a in arguments] +
                                    ["--metrics", metrics, "--checkpoint-dir", checkpoints],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    env=dict(os.environ, OMP_NUM_THREADS="1", **NETWORK))
        try:
            _, errors = launcher.communicate(timeout=WORK_TIME_LIMIT_S)
            self.assertEqual(launcher.returncode, 0, errors)
        except subprocess.TimeoutExpired:
            launcher.terminate()  # the process manager ends the ranks
            try:
                launcher.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.communicate()
            for pid in rank_processes(checkpoints):  # any rank the process manager left behind
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            latest = os.path.join(checkpoints, "latest")
            finished = os.path.exists(latest) and read_metrics(metrics)[1] is not None
            self.assertTrue(finished, "the run hung before finishing its work")
            print(f"{name}: the work finished, MPI_Finalize hung over UCX/TCP (openucx/ucx#8738)")
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

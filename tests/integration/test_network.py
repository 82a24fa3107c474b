"""The equivalence checks over the network transport, as between nodes: MPICH told that no rank is
local (MPIR_CVAR_NOLOCAL=1), UCX over TCP, and no shared-memory windows, so every collective and
transfer crosses a socket. Every layout still reproduces the one-process run."""
import unittest

from common import TrainingTestCase

NETWORK = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp", "MLPTRAIN_SHARED_MEMORY": "0"}
BASE = ["--dataset", "mixture", "--shuffle", "--layers", "6", "--hidden", "16", "--input-dim", "10",
        "--output-dim", "5", "--global-batch", "24", "--micro-batches", "2", "--lr", "3e-3",
        "--grad-clip", "0.05", "--steps", "8", "--log-every", "0"]


class Network(TrainingTestCase):
    def test_layouts_over_tcp(self):
        reference_steps, _, reference = self.train("one", BASE, 1)
        for ranks, extra in ((2, []), (2, ["--zero", "2"]), (4, ["--tp", "2", "--zero", "1"]),
                             (4, ["--pp", "2", "--dp", "2", "--zero", "3"])):
            with self.subTest(ranks=ranks, extra=extra):
                steps, _, tensors = self.train(f"tcp{ranks}{len(extra)}", BASE + extra, ranks,
                                               environment=NETWORK)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)


if __name__ == "__main__":
    unittest.main()

"""The batch script of docs/clusters.md on a real scheduler: a one-node Slurm cluster that the test
starts itself (munged, slurmctld and slurmd in the foreground, a minimal slurm.conf in a temporary
folder, its own ports), the script submitted as the page shows it (the program's path and the
checkpoint folder put in), requeued by `scontrol requeue` once it has saved a checkpoint, started
again at once, and left to finish: the requeued job ends the run (it stopped on SIGTERM, saved,
and continued with --resume auto) with the final checkpoint of an uninterrupted run, bit for bit.
Where Slurm is not installed or its daemons cannot start here, the test says why and skips."""
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import numpy as np

from common import MLPTRAIN, SOURCE_ROOT, TrainingTestCase, read_checkpoint
from doc_pages import blocks, read

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def documented_script():
    """The batch script block of docs/clusters.md (the one the page says this test runs)."""
    page = "docs/clusters.md"
    found = [block for block in blocks(page, read(os.path.join(SOURCE_ROOT, page)))
             if block.skip and "test_slurm.py" in block.skip]
    if len(found) != 1:
        raise AssertionError(f"{page}: expected one batch script marked for test_slurm.py, found {len(found)}")
    return "\n".join(found[0].lines) + "\n"


class SlurmCluster:
    """munged, slurmctld and slurmd of one node, on this machine, in `folder`."""

    def __init__(self, folder):
        self.folder = folder
        self.processes = []
        host = socket.gethostname().split(".")[0]
        self.config = os.path.join(folder, "slurm.conf")
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(folder, sub))
        munge_socket = os.path.join(folder, "munge.socket")
        with open(self.config, "w") as handle:
            handle.write("\n".join([
                "ClusterName=mlptrain", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
                f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
                f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool",
                f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd.pid",
                f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd.log",
                "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
                "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "AuthType=auth/munge",
                f"AuthInfo=socket={munge_socket}", "MpiDefault=none", "ReturnToService=2",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
                f"PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""]))
        self.environment = dict(os.environ, SLURM_CONF=self.config, OMP_NUM_THREADS="1")
        # A key of its own: the cluster needs no machine-wide munge set-up.
        key = os.path.join(folder, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as handle:
            handle.write(os.urandom(1024))
        self.start(["munged", "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
                    f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                    f"--seed-file={folder}/munged.seed"])
        self.start(["slurmctld", "-D", "-f", self.config])
        self.start(["slurmd", "-D", "-f", self.config])

    def start(self, command):
        log = open(os.path.join(self.folder, os.path.basename(command[0]) + ".out"), "w")
        self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environment))
        log.close()

    def command(self, *arguments, check=True):
        return subprocess.run(list(arguments), capture_output=True, text=True, env=self.environment, check=check,
                              timeout=60).stdout

    def ready(self, seconds=30):
        """Whether the node is idle within `seconds`; else why not (the daemons' last words)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(process.poll() is not None for process in self.processes):
                break
            if "idle" in self.command("sinfo", "-h", "-o", "%T", check=False):
                return None
            time.sleep(0.5)
        logs = []
        for name in ("munged.out", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            path = os.path.join(self.folder, name)
            if os.path.exists(path):
                with open(path) as handle:
                    logs += [f"{name}: {line.strip()}" for line in handle.readlines()[-2:]]
        return "the Slurm daemons did not bring a node up: " + " | ".join(logs)

    def job(self, job_id):
        """The job's fields as `scontrol show job` gives them."""
        text = self.command("scontrol", "show", "job", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def stop(self):
        subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True, env=self.environment)
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Slurm(TrainingTestCase):
    def test_the_documented_script_requeued_finishes_the_uninterrupted_run(self):
        missing = [name for name in DAEMONS if shutil.which(name) is None]
        if missing:
            self.skipTest(f"Slurm is not installed here ({', '.join(missing)} not found; scripts/build/setup.sh "
                          "installs slurm-wlm and munge)")
        cluster = SlurmCluster(tempfile.mkdtemp(prefix="mlptrain-slurm-"))
        self.addCleanup(shutil.rmtree, cluster.folder, True)
        self.addCleanup(cluster.stop)
        why_not = cluster.ready()
        if why_not:
            self.skipTest(why_not)

        checkpoints = self.path("ck")
        script = documented_script().replace("build/mlptrain", os.path.abspath(MLPTRAIN))
        script = script.replace("--checkpoint-dir ck", f"--checkpoint-dir {checkpoints}")
        with open(self.path("job.sh"), "w") as handle:
            handle.write(script)
        job_id = cluster.command("sbatch", "--parsable", f"--chdir={self.directory}", self.path("job.sh")).strip()
        # Requeued once its first checkpoint is in: it stops on SIGTERM and saves where it is.
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(checkpoints, "latest")) and time.monotonic() < deadline:
            self.assertNotEqual(cluster.job(job_id).get("JobState"), "COMPLETED", "the job ended before it was requeued")
            time.sleep(0.05)
        self.assertTrue(os.path.exists(os.path.join(checkpoints, "latest")), cluster.job(job_id))
        cluster.command("scontrol", "requeue", job_id)
        # A requeued job waits for a start time ahead; start it now.
        deadline = time.monotonic() + 60
        while cluster.job(job_id).get("JobState") != "PENDING" and time.monotonic() < deadline:
            time.sleep(0.2)
        cluster.command("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        deadline = time.monotonic() + 300
        while cluster.job(job_id).get("JobState") not in ("COMPLETED", "FAILED", "CANCELLED") and time.monotonic() < deadline:
            time.sleep(0.5)
        job = cluster.job(job_id)
        with open(os.path.join(self.directory, f"slurm-{job_id}.out")) as handle:
            output = handle.read()
        self.assertEqual((job.get("JobState"), job.get("Restarts"), job.get("ExitCode")), ("COMPLETED", "1", "0:0"),
                         output)
        self.assertRegex(output, r"stopped by SIGTERM after step \d+ of 3000: saved in ")
        self.assertIn(f"--resume auto: continuing from {checkpoints}/latest", output)

        # The same command, uninterrupted, straight to the end.
        command = re.search(r"mpiexec\.mpich .*?(?<!\\)\n", script, re.S).group(0).replace("\\\n", " ")
        arguments = shlex.split(command.replace('"$SLURM_NTASKS"', "2"))
        arguments[arguments.index("--checkpoint-dir") + 1] = self.path("whole")
        subprocess.run(arguments, check=True, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(arguments[0], "mpiexec.mpich")
        requeued = read_checkpoint(os.path.join(checkpoints, "step_00003000.h5"))
        whole = read_checkpoint(os.path.join(self.path("whole"), "step_00003000.h5"))
        self.assertEqual(sorted(requeued), sorted(whole))
        for tensor, values in whole.items():
            self.assertTrue(np.array_equal(requeued[tensor], values), tensor)
        # --keep-last 2: the newest two step files.
        self.assertEqual(len([name for name in os.listdir(checkpoints) if name.startswith("step_")]), 2)


if __name__ == "__main__":
    unittest.main()

"""A single-node Slurm on localhost for the `slurm` tests.

The session fixture `slurm_cluster` starts, from Debian's slurm-wlm and munge packages
(scripts/install_slurm.sh installs them), a munged with its own key and socket, a slurmctld and a
slurmd, all three as children of pytest, with their state, spool, logs and job-completion log in a
temporary directory. It needs root: the daemons run as root and the configuration has to be at
/etc/slurm/slurm.conf (job steps ignore a SLURM_CONF that points elsewhere and fall back to a DNS
lookup). At teardown it cancels the jobs left, stops the daemons it started (only those) and puts
back whatever was at /etc/slurm/slurm.conf before (nothing, usually).

The cluster has no accounting (no slurmdbd): Slurm's own record of each job is the job-completion
log (jobcomp/filetxt: id, name, state, partition, time limit, node, CPUs and TRES with memory), and
`scontrol show job` keeps every job for a day (MinJobAge), which is what Snakemake's slurm executor
queries with `--slurm-status-command squeue` (`--slurm-no-account` goes with it).

Every test under tests/slurm/ is marked `slurm`. The fixture skips, with the reason, where the
packages are absent, where pytest does not run as root, and where a Slurm it did not start is
already there (a running slurmctld/slurmd or someone else's /etc/slurm/slurm.conf): it never
clobbers a real cluster's configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

CONF_DIR = Path("/etc/slurm")
CONF_PATH = CONF_DIR / "slurm.conf"
CONF_MARKER = "# Written by fp4repro's tests/slurm/conftest.py (slurm_cluster fixture); removed at teardown."
INSTALL_HINT = "slurm tests need Debian's slurm-wlm and munge: run scripts/install_slurm.sh as root"
PARTITION = "debug"
# Memory is bookkeeping only here (no cgroups), so the node declares at least this much, letting
# jobs that ask for a few GB start on a small machine (SlurmdParameters=config_overrides).
MIN_NODE_MEMORY_MB = 8192
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
COMMANDS = (
    "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel", "srun",
    "munged", "mungekey", "munge",
)  # fmt: skip
# Job states after which a job does not change any more (squeue -t all, %T).
END_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
     "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "SPECIAL_EXIT", "REVOKED"}
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# parsing Slurm's key=value records


_FIELD = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|\s*$)")


def parse_record(line: str) -> dict[str, str]:
    """`Key=value Key2=value2 ...` (jobcomp/filetxt lines, `scontrol -o show job`) as a dict."""
    return {key: value for key, value in _FIELD.findall(line.strip())}


def parse_tres(tres: str) -> dict[str, str]:
    """`cpu=2,mem=3G,node=1` -> {'cpu': '2', 'mem': '3G', 'node': '1'}."""
    return dict(part.split("=", 1) for part in tres.split(",") if "=" in part)


def memory_in_mb(value: str) -> float:
    """Slurm's memory notation (`1500M`, `3G`, `2T`, bare number = MB) in MB."""
    match = re.fullmatch(r"([0-9.]+)([KMGT]?)", value.strip())
    if not match:
        raise ValueError(f"not a Slurm memory value: {value!r}")
    number, unit = float(match.group(1)), match.group(2)
    return number * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]


# --------------------------------------------------------------------------------------------
# the cluster


@dataclasses.dataclass
class SlurmCluster:
    root: Path  # the temporary directory: state, spool, logs, munge key and socket
    log_dir: Path  # slurmctld.log, slurmd.log, munged.log and the daemons' stderr
    jobcomp_log: Path  # Slurm's job-completion records (jobcomp/filetxt)
    node: str
    partition: str
    cpus: int
    memory_mb: int
    env: dict[str, str]  # environment for clients (sbatch, snakemake...): PATH, SLURM_CONF

    # -- commands -----------------------------------------------------------------------------
    def run(self, *args: str, check: bool = True, timeout: float = 60, **kwargs):
        """Runs a Slurm client command with the cluster's environment; returns CompletedProcess."""
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\n"
                f"stderr: {proc.stderr}\n{self.log_tails()}"
            )
        return proc

    def sbatch(self, *args: str, cwd: str | Path | None = None) -> int:
        """Submits with `sbatch --parsable ARGS`; returns the job id."""
        out = self.run("sbatch", "--parsable", *args, cwd=cwd).stdout.strip()
        return int(out.split(";")[0])

    def scancel(self, job_id: int, *args: str) -> None:
        self.run("scancel", *args, str(job_id))

    def state(self, job_id: int) -> str:
        """The job's state as squeue reports it (PENDING, RUNNING, COMPLETED, TIMEOUT...)."""
        out = self.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T", check=False)
        return out.stdout.strip()

    def wait_for_state(self, job_id: int, states, timeout: float = 60, poll: float = 0.5) -> str:
        """Waits until the job is in one of `states` (or has ended); returns the state."""
        states = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in states or state in END_STATES:
                return state
            time.sleep(poll)
        raise AssertionError(
            f"job {job_id} still {state or 'unknown'} after {timeout:.0f} s, "
            f"expected {sorted(states)}\n{self.log_tails()}"
        )

    def wait_for_end(self, job_id: int, timeout: float = 120, poll: float = 0.5) -> str:
        """Waits until the job has ended; returns its final state."""
        return self.wait_for_state(job_id, END_STATES, timeout=timeout, poll=poll)

    def show_job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict (kept MinJobAge after the job ended)."""
        return parse_record(self.run("scontrol", "-o", "show", "job", str(job_id)).stdout)

    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld knows of (all of this session's), as `scontrol show job` dicts."""
        out = self.run("scontrol", "-o", "show", "job", check=False).stdout
        return [parse_record(line) for line in out.splitlines() if line.startswith("JobId=")]

    def jobcomp_records(self) -> list[dict[str, str]]:
        """Slurm's job-completion records, one dict per ended job, in the order they ended."""
        if not self.jobcomp_log.exists():
            return []
        text = self.jobcomp_log.read_text(errors="replace")
        return [parse_record(line) for line in text.splitlines() if line.startswith("JobId=")]

    def jobcomp_record(self, job_id: int, timeout: float = 15) -> dict[str, str]:
        """The job-completion record of one job (written when it ends; waits for it)."""
        deadline = time.monotonic() + timeout
        while True:
            for record in self.jobcomp_records():
                if record.get("JobId") == str(job_id):
                    return record
            if time.monotonic() > deadline:
                raise AssertionError(f"no job-completion record for job {job_id}\n{self.log_tails()}")
            time.sleep(0.25)

    parse_tres = staticmethod(parse_tres)
    memory_in_mb = staticmethod(memory_in_mb)

    def log_tails(self, lines: int = 15) -> str:
        """The end of every daemon log, for failure messages."""
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# start and stop


def _search_path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(parts + [p for p in SBIN if p not in parts])


def _running(names) -> list[str]:
    """`name (pid N)` for each running process whose command name is one of `names`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            comm = (proc / "comm").read_text().strip()
            if comm in names:
                found.append(f"{comm} (pid {proc.name})")
    return found


def _unavailable_reason() -> str | None:
    path = _search_path()
    missing = [cmd for cmd in COMMANDS if shutil.which(cmd, path=path) is None]
    if missing:
        return f"{INSTALL_HINT} (missing: {', '.join(missing)})"
    if os.geteuid() != 0:
        return "slurm tests start slurmctld/slurmd and write /etc/slurm/slurm.conf: run pytest as root"
    return None


def _foreign_slurm_reason() -> str | None:
    running = _running({"slurmctld", "slurmd"})
    if running:
        return (
            f"a Slurm not started by these tests is running ({', '.join(running)}): "
            "the slurm tests start their own single-node cluster and leave a real one alone"
        )
    if CONF_PATH.exists():
        head = CONF_PATH.read_text(errors="replace").splitlines()[:1]
        if head != [CONF_MARKER]:
            return (
                f"{CONF_PATH} exists and was not written by these tests: the slurm tests "
                "write their own there and do not overwrite a real cluster's configuration"
            )
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def _slurm_conf(root: Path, node: str, cpus: int, memory_mb: int, munge_socket: Path) -> str:
    ctld_port, slurmd_port = _free_port(), _free_port()
    while slurmd_port == ctld_port:
        slurmd_port = _free_port()
    return f"""{CONF_MARKER}
# Single-node test cluster, state in {root}
ClusterName=fp4repro-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
# Ended jobs stay visible to squeue/scontrol (Snakemake's status queries) for a day.
MinJobAge=86400
# Time limits are in minutes and checked every 30 s; a cancelled or timed-out job gets SIGKILL
# 2 s after SIGTERM.
KillWait=2
OverTimeLimit=0
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def _stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def slurm_cluster(request):
    """A running single-node Slurm on localhost (see the module docstring); a SlurmCluster."""
    reason = _unavailable_reason()
    if reason:
        pytest.skip(reason)

    with contextlib.ExitStack() as stack:
        # One test session at a time: a lock on /etc/slurm itself, held for the whole session.
        created_conf_dir = not CONF_DIR.exists()
        CONF_DIR.mkdir(parents=True, exist_ok=True)
        if created_conf_dir:
            stack.callback(lambda: CONF_DIR.rmdir() if not any(CONF_DIR.iterdir()) else None)
        lock_fd = os.open(CONF_DIR, os.O_RDONLY)
        stack.callback(os.close, lock_fd)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.skip(f"another test session holds the local test Slurm (lock on {CONF_DIR})")
        reason = _foreign_slurm_reason()
        if reason:
            pytest.skip(reason)

        path = _search_path()
        which = {cmd: shutil.which(cmd, path=path) for cmd in COMMANDS}
        root = Path(tempfile.mkdtemp(prefix="fp4repro-slurm-"))
        # Keep the logs of a session with failures; say where they are.
        stack.callback(
            lambda: (
                shutil.rmtree(root, ignore_errors=True)
                if request.session.testsfailed == 0
                else print(f"\nslurm_cluster: logs kept in {root}")
            )
        )
        munge_dir, log_dir = root / "munge", root / "log"
        for sub in ("state", "spool", "log", "munge"):
            (root / sub).mkdir()
        # munged wants every directory up to its socket searchable by all, and its key private.
        for d in (root, munge_dir):
            d.chmod(0o755)
        munge_socket = munge_dir / "munge.socket.2"
        key = munge_dir / "munge.key"
        subprocess.run([which["mungekey"], "--create", f"--keyfile={key}"], check=True)
        key.chmod(0o600)

        node = socket.gethostname().split(".")[0]
        cpus = len(os.sched_getaffinity(0))
        memory_mb = max(_memory_mb(), MIN_NODE_MEMORY_MB)
        cluster = SlurmCluster(
            root=root,
            log_dir=log_dir,
            jobcomp_log=root / "jobcomp.log",
            node=node,
            partition=PARTITION,
            cpus=cpus,
            memory_mb=memory_mb,
            env=_client_env(path),
        )

        # Put /etc/slurm/slurm.conf back as it was (a stale one of ours, or nothing) at the end.
        original = CONF_PATH.read_bytes() if CONF_PATH.exists() else None
        original_mode = CONF_PATH.stat().st_mode if original is not None else None

        def restore_conf():
            if original is None:
                CONF_PATH.unlink(missing_ok=True)
            else:
                CONF_PATH.write_bytes(original)
                CONF_PATH.chmod(original_mode & 0o7777)

        stack.callback(restore_conf)
        CONF_PATH.write_text(_slurm_conf(root, node, cpus, memory_mb, munge_socket))
        CONF_PATH.chmod(0o644)

        def start(name: str, *args: str) -> subprocess.Popen:
            err = open(log_dir / f"{name}.stderr", "wb")  # noqa: SIM115 (closed at teardown)
            stack.callback(err.close)
            proc = subprocess.Popen(
                [which[name], *args], stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                env=cluster.env, start_new_session=True,
            )  # fmt: skip
            stack.callback(_stop, proc)  # stopped in reverse order of starting
            return proc

        munged = start(
            "munged", "--foreground", f"--socket={munge_socket}", f"--key-file={key}",
            f"--log-file={log_dir / 'munged.log'}", f"--pid-file={munge_dir / 'munged.pid'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
        )  # fmt: skip
        _wait_until(
            lambda: subprocess.run(
                [which["munge"], "-n", f"--socket={munge_socket}"], capture_output=True
            ).returncode == 0,
            30, "munged answering", cluster, [munged],
        )  # fmt: skip
        slurmctld = start("slurmctld", "-D")
        slurmd = start("slurmd", "-D")
        daemons = [munged, slurmctld, slurmd]
        stack.callback(_cancel_all_jobs, cluster)  # runs before the daemons are stopped

        def node_idle():
            out = cluster.run("sinfo", "-h", "-N", "-n", node, "-o", "%T", check=False)
            return out.stdout.strip() == "idle"

        _wait_until(node_idle, 60, f"node {node} idle in sinfo", cluster, daemons)
        yield cluster


def _client_env(path: str) -> dict[str, str]:
    """The caller's environment without any SLURM_*/SBATCH_* settings, for this cluster."""
    prefixes = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PATH"] = path
    env["SLURM_CONF"] = str(CONF_PATH)
    return env


def _wait_until(condition, timeout: float, what: str, cluster: SlurmCluster, daemons) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p.args[0] for p in daemons if p.poll() is not None]
        if dead:
            pytest.fail(f"{', '.join(dead)} exited while waiting for {what}\n{cluster.log_tails()}")
        if condition():
            return
        time.sleep(0.5)
    pytest.fail(f"no {what} after {timeout} s\n{cluster.log_tails()}")


def _cancel_all_jobs(cluster: SlurmCluster, timeout: float = 30) -> None:
    """Cancels every job still pending or running and waits until they are gone."""
    active = "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING"

    def active_jobs():
        out = cluster.run("squeue", "-h", "-t", active, "-o", "%i", check=False)
        return out.stdout.split() if out.returncode == 0 else []

    jobs = active_jobs()
    if not jobs:
        return
    cluster.run("scancel", *jobs, check=False)
    deadline = time.monotonic() + timeout
    while active_jobs() and time.monotonic() < deadline:
        time.sleep(0.5)

import contextlib
import errno
import io
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:
    # make test's workers share the machine's cores, one each: a worker's torch (and every process it
    # starts, which inherit the variables) computes on one thread. With torch's default of one thread
    # per core, the workers' OpenMP threads spin-wait on each other's cores and the suite takes twice
    # the CPU time. Set before torch is imported, which reads them then.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

import torch  # noqa: E402  (after the thread count above)

# Without CUDA, Triton kernels run in Triton's interpreter. The variable must be set before
# anything imports triton (megatron-core does, and the kernels read it when they are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _outside_the_checkout(tmp_path, monkeypatch):
    """Every test runs in its own empty folder: configs are looked up in ./configs first, so a
    user's ./configs at the repository root must not change what the tests see."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _process_environment_restored(monkeypatch):
    """Deterministic mode sets process-wide variables (``fp4repro.util.deterministic_algorithms``,
    ``fp4repro.model.deterministic_mamba_ssm``): each test leaves them as it found them."""
    names = ("MAMBA_DETERMINISTIC", "TRITON_CACHE_AUTOTUNING", "CUBLAS_WORKSPACE_CONFIG", "TORCHINDUCTOR_DETERMINISTIC")
    for name in names:
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)


#: ``make test`` runs pytest-xdist (``-n auto``) with the scheduler below: each test is a unit of work
#: of its own, as in xdist's ``load``, but the Slurm tests are one unit, run whole by one worker:
#: one machine runs one test Slurm, and a second worker's would skip. The workers share one run of
#: the smoke study (``smoke_run``).
def _unit(nodeid: str) -> str:
    return "tests/slurm" if nodeid.startswith("tests/slurm/") else nodeid


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without xdist it is never called
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # the units in the order of the collection
    return UnitScheduling(config, log)


def _long_modules_first(items) -> None:
    """Reorder ``items`` in place: the modules with a ``slow`` test and the Slurm unit first, each
    module's tests kept together and in order. The scheduler hands units out in this order, so
    the longest start at once and the short ones fill in beside them, instead of leaving one
    worker busy with a long module at the end while the others idle."""
    module = {item: item.nodeid.split("::")[0] for item in items}
    long = {module[item] for item in items if "slow" in item.keywords or _unit(item.nodeid) != item.nodeid}
    items.sort(key=lambda item: module[item] not in long)  # stable: the order kept within each part


def pytest_collection_modifyitems(config, items):
    _long_modules_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------------- model configs

#: Every layer type at tiny sizes; a Mamba chunk of 8 makes short sequences span several chunks.
TEST_MODEL = dict(
    name="test",
    pattern="M-M*-",
    hidden_size=32,
    vocab_size=64,
    mlp_hidden_size=64,
    attn_heads=4,
    attn_kv_heads=2,
    attn_head_dim=8,
    mamba_heads=8,
    mamba_head_dim=8,
    mamba_state_size=8,
    mamba_groups=2,
    mamba_conv_kernel=4,
    mamba_chunk_size=8,
)


@pytest.fixture
def make_config():
    """A ModelConfig of every layer type at tiny sizes, with fields replaced by keyword."""
    from fp4repro.config.model import ModelConfig

    def make(**overrides) -> ModelConfig:
        return ModelConfig(**{**TEST_MODEL, **overrides})

    return make


# ------------------------------------------------------------------------- the Snakemake DAG

SNAKEFILE = Path(__file__).resolve().parents[1] / "workflow" / "Snakefile"

#: SLURM_CONF of a Snakemake that runs without a Slurm cluster (the Slurm tests give their own).
#: Snakemake imports its Slurm executor plugin at every start, and the plugin asks `scontrol show
#: config` for MinJobAge: without a reachable controller scontrol retries until the plugin's 10 s
#: timeout (a missing slurm.conf, or a stale one), ten seconds of every run; reading an empty
#: configuration it gives up at once.
NO_SLURM_CLUSTER = os.devnull


class Snakemake:
    """`snakemake -s workflow/Snakefile -d WORKDIR ARGS` in a subprocess (tests/workflow, tests/slurm);
    `main` is what Python is given to start it: `-m snakemake`, or `-c CODE` that ends in its main()."""

    def __init__(self, *main: str):
        self.main = main or ("-m", "snakemake")

    def command(self, workdir: Path, *args: str) -> list[str]:
        return [sys.executable, *self.main, "-s", str(SNAKEFILE), "-d", str(workdir), *args]

    def __call__(
        self, workdir: Path, *args: str, check: bool = True, env: dict | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess:
        cmd = self.command(workdir, *args)
        env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1"}
        env.setdefault("SLURM_CONF", NO_SLURM_CLUSTER)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        return proc

    @staticmethod
    def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
        """Rule -> job count from a dry run's 'Job stats' table ({} when nothing is to be done)."""
        text = proc.stdout + proc.stderr
        if "Nothing to be done" in text:
            return {}
        table = text.split("Job stats:")[1].split("total")[0]
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture(scope="session")
def snakemake() -> Snakemake:
    return Snakemake()


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (created), held while the block runs."""
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, snakemake) -> Path:
    """The reduced study (the packaged configs/experiment/smoke.yaml) run locally through Snakemake,
    once per session: its working directory (results/, figures/, paper/smoke/report.md, logs/).
    pytest-xdist's workers share it: the first to need it makes it in the session's temporary
    folder while holding a lock, and the others wait for it there."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base  # above every worker's own
    workdir, made = shared / "smoke-local", shared / "smoke-local.done"
    with _locked(shared / "smoke-local.lock"):
        if not made.exists():
            workdir.mkdir(exist_ok=True)
            snakemake(workdir, "--cores", "2", "--config", "experiment=smoke")
            made.touch()
    return workdir


# ------------------------------------------------------------------------------- a full disk


class _FullFile(io.FileIO):
    """A file on a full disk: it opens, and every write fails with ENOSPC (as /dev/full's do); no
    file descriptor is handed out, so that no writer reaches the real file around ``write``."""

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk("resume_")``: from then on, every binary write to a file whose name starts with
    ``.resume_`` (the temporary file of an atomic writer of ``resume_*``, or a dataset's staged
    files) fails with ENOSPC, as on a full disk; ``full_disk(None)``: none again. Python's writers
    are caught where they open the file (``open``: matplotlib, PIL, megatron-core's dataset builder;
    ``os.fdopen``: ``fp4repro.util``), so that no /dev/full is needed (some machines have none)."""
    import builtins

    filled: list[str] = []
    real_open, real_fdopen = builtins.open, os.fdopen

    def full(name) -> bool:
        return bool(filled) and Path(os.fsdecode(name)).name.startswith(f".{filled[0]}")

    def opened(file, mode: str):
        raw = _FullFile(file, mode.replace("b", ""))
        return io.BufferedRandom(raw) if "+" in mode else io.BufferedWriter(raw)

    def fake_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and "b" in mode and mode[0] in "wax" and full(file):
            return opened(file, mode)
        return real_open(file, mode, *args, **kwargs)

    def fake_fdopen(fd, mode="r", *args, **kwargs):
        if "b" in mode and mode[0] in "wax" and full(os.readlink(f"/proc/self/fd/{fd}")):
            return opened(fd, mode)
        return real_fdopen(fd, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "fdopen", fake_fdopen)

    def fill(start: str | None) -> None:
        filled[:] = [] if start is None else [start]

    return fill


# A small study and its prepared data, for the tests that start `fp4repro train` processes (its guards
# in tests/train, the benchmark of the step in tests/bench).
STDLIB = sysconfig.get_paths()["stdlib"]
#: 400 steps of the tiny model: long enough for a run to still be training while a test looks at it
GUARDED = f"""name: guarded
model: tiny
recipes: [bf16]
data:
  sources:
    prose: {{kind: text, paths: ["{STDLIB}/json/*.py", "{STDLIB}/textwrap.py"]}}
  tokenizer: {{vocab_size: 2048}}
  split: {{valid: 0.1, test: 0.1}}
train:
  seq_len: 16
  batch_size: 2
  checkpoints: 4
  telemetry_every: 1
  resume_every: 5
  stages:
    - {{name: s1, tokens: 12800, blend: {{prose: 1.0}}}}
"""


@pytest.fixture(scope="session")
def guarded(tmp_path_factory) -> tuple[Path, Path]:
    """(the study's experiment file, its prepared data folder), prepared once per session."""
    from fp4repro.config.experiment import load_experiment
    from fp4repro.data import prepare_data

    root = tmp_path_factory.mktemp("guarded")
    path = root / "guarded.yaml"
    path.write_text(GUARDED)
    prepare_data(load_experiment(path), root / "data", progress=False)
    return path, root / "data"

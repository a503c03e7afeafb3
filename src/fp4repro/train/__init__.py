"""Training of the reference model: WSD schedule, run folders per fingerprint, atomic
checkpoints, exact resume, metrics and telemetry."""

from fp4repro.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from fp4repro.train.loop import NonFiniteLoss, eval_checkpoint_steps, train
from fp4repro.train.runs import RunFolder, list_runs
from fp4repro.train.schedule import WSDSchedule

__all__ = [
    "CheckpointError",
    "load_checkpoint",
    "save_checkpoint",
    "NonFiniteLoss",
    "eval_checkpoint_steps",
    "train",
    "RunFolder",
    "list_runs",
    "WSDSchedule",
]

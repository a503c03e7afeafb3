"""What trains a model for the loop (``fp4repro.train.loop``): one engine per backend.

The loop owns what every backend shares (stages, batches, metrics, telemetry, evaluation
checkpoints, run folders); an engine owns the model, its optimizer and LR schedule, one optimizer
step, and its resume checkpoints. ``ReferenceEngine`` is the reference model with torch's AdamW;
``fp4repro.megatron.engine.MegatronEngine`` is megatron-core's model, DDP and distributed optimizer.
Both have the shape of ``Engine``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from fp4repro.config.experiment import TrainConfig
from fp4repro.config.recipe import Recipe
from fp4repro.config.study import Study
from fp4repro.model import NemotronH, compile_conv1d, compile_elementwise
from fp4repro.quant.state import QuantState
from fp4repro.train.checkpoint import CheckpointWriter, load_latest_resume, prune_resume
from fp4repro.train.schedule import WSDSchedule
from fp4repro.util import OPTIMIZER_PHASE, rng_state, set_rng_state

#: a step's loss or gradient norm: a float, or a 0-d tensor on the device that the loop reads one
#: step later (reading it at once would stop the host until the GPU has finished the step)
StepValue = float | torch.Tensor


class Engine(Protocol):
    quant_state: QuantState
    writer: bool  # this process writes the run's files (rank 0)
    model: torch.nn.Module  # the model it trains (a profile labels its norms: fp4repro.train.profiling)

    def step(self, step: int, batch: torch.Tensor) -> tuple[StepValue, StepValue, float]:
        """One optimizer step on the global batch (sequences of seq_len + 1 tokens): (loss,
        gradient norm before clipping, LR). With a non-finite loss or norm the parameters stay, at
        this step and, where the loss and norm are returned on the device, at every later one."""

    def forward_backward(self, batch: torch.Tensor) -> None:
        """Forward and backward only (gradients zeroed before; the diagnosis of a failed step)."""

    def eval_state_dict(self) -> dict:
        """The model's weights in the reference model's layout (what evaluation loads)."""

    def save_resume(self, folder: Path, step: int, meta: dict, writer: CheckpointWriter) -> None:
        """A resume checkpoint after ``step`` steps (older ones pruned to the newest two), written
        by ``writer`` (in the background where the engine's checkpoint is one file)."""

    def load_resume(self, folder: Path) -> int:
        """Restore the newest valid resume checkpoint in ``folder``; the step it holds, 0 without one."""


def forward_logits(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The training forward: BF16 autocast on CUDA (FP32 on CPU), logits returned in FP32.
    Evaluation calls this too, so that it scores the model as it was trained."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=inputs.is_cuda):
        return model(inputs).float()


def lm_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``forward_logits``, in FP32."""
    return F.cross_entropy(forward_logits(model, inputs).flatten(0, 1), targets.flatten())


def to_device(batch: torch.Tensor, device: str) -> torch.Tensor:
    """The batch on ``device`` without stopping the host: a copy from pageable host memory waits
    for the work queued on the GPU before it; one from pinned memory is queued behind it."""
    if torch.device(device).type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)


def build_optimizer(model: torch.nn.Module, t: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (linears, embedding, conv), none on norms and SSM vectors.
    torch's fused AdamW with ``train.fused_kernels``, else its single-tensor implementation: a loop
    over the parameters, some eight kernels each (``fused=False`` turns off the multi-tensor
    default too), which every run made before the field used."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.lr,
        betas=tuple(t.betas),
        eps=1e-8,
        fused=t.fused_kernels,
    )


class ReferenceEngine:
    """The reference model (``fp4repro.model.NemotronH``) in this process: BF16 autocast on CUDA,
    FP32 on CPU, torch AdamW with the WSD LR set before each step, gradient clipping by total
    norm; a resume checkpoint is one file (``fp4repro.train.checkpoint``)."""

    writer = True

    def __init__(
        self, study: Study, recipe: Recipe, seed: int, device: str, schedule: WSDSchedule, initial: dict | None = None
    ):
        """``initial``: weights to start from (the reference layout) instead of the seed's initialization."""
        torch.manual_seed(seed)
        self.model = NemotronH(study.model, recipe)
        if initial is not None:
            self.model.load_state_dict(initial, strict=True)
        self.model.to(device)
        if study.experiment.train.fused_kernels:
            compile_elementwise(self.model)
        if study.experiment.train.compiled_conv1d:
            compile_conv1d(self.model)
        self.quant_state = self.model.quant_state
        self.quant_state.seed = seed
        self.optimizer = build_optimizer(self.model, study.experiment.train)
        self.schedule, self.grad_clip, self.device = schedule, study.experiment.train.grad_clip, device
        self.failed = torch.zeros((), dtype=torch.bool, device=device)  # a step's loss or norm was non-finite
        self.model.train()

    def step(self, step: int, batch: torch.Tensor) -> tuple[StepValue, StepValue, float]:
        """With fused AdamW, no synchronization: the loss and norm stay on the device, and AdamW
        skips its update on the device (``found_inf``: its kernel returns before touching the
        parameters and moments; the step count is restored) once either has been non-finite.
        torch's single-tensor AdamW has no such input: its step reads both first."""
        batch = to_device(batch, self.device)
        lr = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = lm_loss(self.model, batch[:, :-1], batch[:, 1:])
        loss.backward()
        loss = loss.detach()
        with torch.profiler.record_function(OPTIMIZER_PHASE):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            if self.optimizer.defaults["fused"]:
                self.failed |= ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
                self.optimizer.found_inf = self.failed.float()
                self.optimizer.step()
            else:
                loss, grad_norm = loss.item(), grad_norm.item()
                if math.isfinite(loss) and math.isfinite(grad_norm):
                    self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm, lr

    def forward_backward(self, batch: torch.Tensor) -> None:
        self.model.zero_grad(set_to_none=True)
        batch = to_device(batch, self.device)
        lm_loss(self.model, batch[:, :-1], batch[:, 1:]).backward()

    def eval_state_dict(self) -> dict:
        return self.model.state_dict()

    def save_resume(self, folder: Path, step: int, meta: dict, writer: CheckpointWriter) -> None:
        writer.save(
            {
                "step": step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "quant_state": self.quant_state.state_dict(),
                "rng": rng_state(),
                **meta,
            },
            folder / f"resume_{step:08d}.pt",
            then=lambda: prune_resume(folder),
        )

    def load_resume(self, folder: Path) -> int:
        resume = load_latest_resume(folder)
        if resume is None:
            return 0
        self.model.load_state_dict(resume["model"])
        self.optimizer.load_state_dict(resume["optimizer"])
        self.quant_state.load_state_dict(resume["quant_state"])
        self.quant_state.to(self.device)
        set_rng_state(resume["rng"])
        return resume["step"]

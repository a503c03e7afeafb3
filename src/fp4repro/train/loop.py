"""The training loop of the reference model: read it top to bottom.

One run = one experiment × one recipe, over all stages, with one WSD schedule. Per optimizer step:
take the step's batch from its stage's sampler (a pure function of the step, so resuming needs
only the step), forward (BF16 autocast on CUDA, FP32 on CPU), cross-entropy, backward, stop on a
non-finite loss or gradient, clip, AdamW, advance the quantization state (periodic amax refresh
counts optimizer steps). Evaluation checkpoints (model only) land at ``checkpoints`` points evenly
spaced in tokens; a rolling resume checkpoint (model, optimizer, quantization state, RNG states,
step, metrics so far) every ``resume_every`` steps. Outputs in ``out_dir``:

    metrics.parquet     one row per step: step, tokens, stage, loss, lr, grad_norm, tokens_per_s
    telemetry.parquet   every ``telemetry_every`` steps, one row per layer × operand × quantization
    ckpt/step_XXXXXXXX.pt   evaluation checkpoints;  resume/resume_XXXXXXXX.pt   resume checkpoints
    done.json           written last: the run finished
"""

from __future__ import annotations

import hashlib
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm

from fp4repro.experiment import ExperimentConfig
from fp4repro.model import NemotronH, load_model_config
from fp4repro.recipes import load_recipe
from fp4repro.train.checkpoint import load_latest_resume, prune_resume, save_checkpoint
from fp4repro.train.schedule import WSDSchedule
from fp4repro.util import atomic_path, atomic_write_json


class NonFiniteLoss(RuntimeError):
    pass


@dataclass(frozen=True)
class StepPlan:
    """Where each optimizer step sits: its stage and its index within that stage."""

    stage_of_step: tuple[int, ...]
    first_step_of_stage: tuple[int, ...]

    @classmethod
    def build(cls, stage_steps: list[int]) -> "StepPlan":
        stage_of_step, first = [], []
        for i, n in enumerate(stage_steps):
            first.append(len(stage_of_step))
            stage_of_step += [i] * n
        return cls(tuple(stage_of_step), tuple(first))


def eval_checkpoint_steps(total_steps: int, count: int) -> list[int]:
    """Steps after which evaluation checkpoints are saved: ``count`` points evenly spaced in
    tokens (every step has the same tokens), the last one at the end of training."""
    return sorted({max(1, round(i * total_steps / count)) for i in range(1, count + 1)})


def build_optimizer(model: torch.nn.Module, exp: ExperimentConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (linears, embedding, conv), none on norms and SSM vectors."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    t = exp.train
    return torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=t.lr, betas=tuple(t.betas), eps=1e-8, fused=False)


def forward_logits(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The training forward: BF16 autocast on CUDA (FP32 on CPU), logits returned in FP32.
    Evaluation calls this too, so that it scores the model as it was trained."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=inputs.is_cuda):
        return model(inputs).float()


def lm_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``forward_logits``, in FP32."""
    return F.cross_entropy(forward_logits(model, inputs).flatten(0, 1), targets.flatten())


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_tables(out_dir: Path, metrics: list[dict], telemetry: list[dict]) -> None:
    with atomic_path(out_dir / "metrics.parquet") as tmp:
        pd.DataFrame(metrics, columns=["step", "tokens", "stage", "loss", "lr", "grad_norm", "tokens_per_s"]
                     ).to_parquet(tmp, index=False)
    columns = ["step", "layer", "operand", "blocks", "saturated_blocks", "underflow_blocks", "nonzero_elements",
               "zeroed_elements", "nonfinite_blocks", "sq_error", "sq_norm", "amax_ratio", "rel_error"]
    with atomic_path(out_dir / "telemetry.parquet") as tmp:
        pd.DataFrame(telemetry, columns=columns).to_parquet(tmp, index=False)


def _worst_operands(rows: list[dict], n: int = 5) -> str:
    ranked = sorted(rows, key=lambda r: (r["nonfinite_blocks"], r["saturated_blocks"]), reverse=True)[:n]
    return "; ".join(f"{r['layer']}.{r['operand']}: {r['nonfinite_blocks']} non-finite, "
                     f"{r['saturated_blocks']} saturated of {r['blocks']} blocks" for r in ranked)


def run_fingerprint(train_config, model_config, recipe, data_hash: str) -> str:
    """A digest of everything a training run's result depends on: the training config, the model
    config, the recipe's resolved numerics and the prepared data. A resume checkpoint is trusted
    only by a run with the same fingerprint (an edited recipe or schedule starts from step 0)."""
    parts = (train_config, model_config, recipe.defaults, recipe.operands, recipe.overrides, data_hash)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def train(exp: ExperimentConfig, recipe_name: str, data_dir: Path, out_dir: Path,
          device: str | None = None, progress: bool = True, stop_after: int | None = None) -> Path:
    """Train (or resume) one recipe of an experiment; returns ``out_dir``.

    stop_after: end after this many optimizer steps in total (for tests and dry runs); the run
    stays resumable and is not marked done.
    """
    from fp4repro.data import StageSampler, load_manifest

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    t = exp.train
    out_dir.mkdir(parents=True, exist_ok=True)
    resume_dir, ckpt_dir = out_dir / "resume", out_dir / "ckpt"

    # ---- model, optimizer, schedule, data: all a function of the config and the seed
    torch.manual_seed(t.seed)
    model_config, recipe = load_model_config(exp.model), load_recipe(recipe_name)
    model = NemotronH(model_config, recipe).to(device)
    state = model.quant_state
    optimizer = build_optimizer(model, exp)
    schedule = WSDSchedule.from_fractions(t.lr, t.total_steps, t.warmup_fraction, t.decay_fraction, t.min_lr_ratio)
    stage_steps = t.stage_steps()
    plan = StepPlan.build(stage_steps)
    manifest = load_manifest(data_dir)
    samplers = [StageSampler(manifest, dict(stage.blend), t.seq_len, n * t.batch_size, seed=t.seed + i,
                             cache_dir=data_dir / "cache")
                for i, (stage, n) in enumerate(zip(t.stages, stage_steps))]
    eval_steps = set(eval_checkpoint_steps(t.total_steps, t.checkpoints))

    # ---- resume (only what this very config produced)
    fingerprint = run_fingerprint(t, model_config, recipe, manifest.data_hash)
    start_step, metrics, telemetry = 0, [], []
    resume = load_latest_resume(resume_dir)
    if resume is not None and resume.get("fingerprint") != fingerprint:
        print(f"{out_dir}: the resume checkpoints were made with another config, recipe or data "
              f"(fingerprint {resume.get('fingerprint')} != {fingerprint}); starting from step 0", file=sys.stderr)
        for stale in (resume_dir, ckpt_dir):
            shutil.rmtree(stale, ignore_errors=True)
        (out_dir / "done.json").unlink(missing_ok=True)
        resume = None
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        if state is not None:
            state.load_state_dict(resume["quant_state"])
            state.to(device)
        _set_rng_state(resume["rng"])
        start_step, metrics, telemetry = resume["step"], resume["metrics"], resume["telemetry"]
        print(f"{out_dir}: resuming from step {start_step} of {t.total_steps}", file=sys.stderr)

    def save_resume(step: int) -> None:
        save_checkpoint({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "quant_state": state.state_dict() if state is not None else None, "rng": _rng_state(),
                         "metrics": metrics, "telemetry": telemetry, "recipe": recipe_name, "experiment": exp.name,
                         "fingerprint": fingerprint},
                        resume_dir / f"resume_{step:08d}.pt")
        prune_resume(resume_dir)
        _write_tables(out_dir, metrics, telemetry)

    end_step = t.total_steps if stop_after is None else min(t.total_steps, stop_after)
    bar = tqdm(total=t.total_steps, initial=start_step, disable=not progress, unit="step",
               desc=f"{exp.name}/{recipe_name}", dynamic_ncols=True, file=sys.stderr)
    model.train()
    try:
        for step in range(start_step, end_step):
            started = time.perf_counter()
            stage = plan.stage_of_step[step]
            batch = samplers[stage].batch((step - plan.first_step_of_stage[stage]) * t.batch_size, t.batch_size)
            batch = batch.to(device)
            inputs, targets = batch[:, :-1], batch[:, 1:]
            lr = schedule(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if state is not None:
                state.telemetry = step % t.telemetry_every == 0

            loss = lm_loss(model, inputs, targets)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            if not (math.isfinite(loss.item()) and math.isfinite(grad_norm.item())):
                raise NonFiniteLoss(_diagnose(model, inputs, targets, step, loss.item(), grad_norm.item()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if state is not None:
                state.advance()
                telemetry.extend(state.pop_telemetry())

            elapsed = time.perf_counter() - started
            tokens = (step + 1) * t.tokens_per_step
            metrics.append({"step": step + 1, "tokens": tokens, "stage": t.stages[stage].name, "loss": loss.item(),
                            "lr": lr, "grad_norm": grad_norm.item(), "tokens_per_s": t.tokens_per_step / elapsed})
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{t.tokens_per_step / elapsed:,.0f}",
                            stage=t.stages[stage].name)

            done = step + 1
            if done in eval_steps:
                save_checkpoint({"model": model.state_dict(), "step": done, "tokens": tokens,
                                 "stage": t.stages[stage].name, "model_config": exp.model, "recipe": recipe_name,
                                 "experiment": exp.name}, ckpt_dir / f"step_{done:08d}.pt")
            if done % t.resume_every == 0 or done == end_step:
                save_resume(done)
    except NonFiniteLoss:
        _write_tables(out_dir, metrics, telemetry)   # the steps before the failure, nothing after
        raise
    finally:
        bar.close()

    if end_step == t.total_steps:
        _write_tables(out_dir, metrics, telemetry)
        atomic_write_json(out_dir / "done.json", {
            "experiment": exp.name, "recipe": recipe_name, "fingerprint": fingerprint, "steps": t.total_steps,
            "tokens": t.total_steps * t.tokens_per_step,
            "checkpoints": sorted(f"ckpt/step_{s:08d}.pt" for s in eval_steps)})
    return out_dir


def _diagnose(model, inputs, targets, step, loss, grad_norm) -> str:
    """Redo the failing step with telemetry on and name the operands with the most non-finite and
    saturated blocks (the state is not advanced and nothing is written)."""
    message = f"step {step + 1}: non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} " \
              f"(loss {loss}, grad norm {grad_norm})"
    state = model.quant_state
    if state is None:
        return message + "; recipe bf16 has no quantization telemetry"
    state.pop_telemetry()
    state.telemetry = True
    model.zero_grad(set_to_none=True)
    lm_loss(model, inputs, targets).backward()
    rows = state.pop_telemetry()
    return message + "; worst operands: " + _worst_operands(rows)

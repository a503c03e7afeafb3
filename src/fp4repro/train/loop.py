"""The training loop, the same for every backend: read it top to bottom.

One run = one experiment × one recipe, over all stages, with one WSD schedule. Per optimizer step:
take the step's batch from its stage's sampler (a pure function of the step, so resuming needs
only the step), let the backend's engine (``fp4repro.train.engine``) take one optimizer step
(forward under BF16 autocast on CUDA, FP32 on CPU, cross-entropy, backward, clip, AdamW), stop on a
non-finite loss or gradient, advance the quantization state (periodic amax refresh counts
optimizer steps). An engine may return the step's loss and norm on the device (the reference
engine with fused AdamW): the loop reads them after launching the next step, so that the host
queues the next step's kernels while the GPU runs this one instead of waiting for it; it reads at
once before a checkpoint (which holds finite steps only) and before a step that samples a fresh
amax (a failing step is redone with the amax it held). Evaluation checkpoints (model only) land at
``checkpoints`` points evenly spaced in tokens (for a seed outside ``eval.curve_seeds`` only the
last: ``saved_checkpoint_steps``); a rolling resume checkpoint (model, optimizer, quantization
state, RNG states, step) every ``resume_every`` steps, after the metrics and telemetry of the steps since the last
one (``fp4repro.train.runs`` gives the layout: one run folder per fingerprint). The evaluation
checkpoints and the reference engine's resume checkpoints are written in the background while the
next steps train (``fp4repro.train.checkpoint.CheckpointWriter``; megatron's resume checkpoints are
written collectively, in the step); the run waits for them before it ends, on an error too. Outputs in
``out_dir``, written when the run finishes:

    metrics.parquet     one row per step: step, tokens, stage, loss, lr, grad_norm, tokens_per_s,
                        attempt (which process computed the step: 0 for the first to work on the
                        run folder, +1 for each later one, a resume or a restart)
    telemetry.parquet   every ``telemetry_every`` steps (and at each amax sample with
                        ``telemetry_at_refresh``: ``fp4repro.train.cadence``), one row per layer ×
                        operand × quantization
    done.json           written last: the run finished, its fingerprint, its evaluation checkpoints
                        and where its process spent its time (``fp4repro.train.phases``)

With a profile window (``fp4repro.train.profiling``, ``fp4repro train --profile-steps``) the process
also writes where the window's steps spent their time (default ``profile.json`` in ``out_dir``);
nothing else changes.

A run whose loss or gradient norm turns non-finite has ended too: it is a result, not a crash. Its
tables hold the steps before and the failing step's telemetry (the step redone with telemetry on,
on the parameters before it: the engine updates none after a non-finite step),
and done.json says ``diverged`` (the step and the worst operands) beside the evaluation
checkpoints saved before it; the run is resumable as any other.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from fp4repro.config.files import recorded_name
from fp4repro.config.numerics import numerics_record
from fp4repro.config.study import Study, refresh_intervals
from fp4repro.data import Manifest, RunSampler, load_manifest
from fp4repro.data.integrity import VERIFIED, verify_token_files
from fp4repro.errors import FP4ReproError
from fp4repro.megatron.resume import resume_dirs
from fp4repro.model import deterministic_mamba_ssm
from fp4repro.model.fit import state_dict_mismatch
from fp4repro.provenance import provenance
from fp4repro.results import write_json, write_table
from fp4repro.train.cadence import is_telemetry_step, refresh_steps_of, samples_amax
from fp4repro.train.checkpoint import CheckpointWriter, load_checkpoint, resume_checkpoints
from fp4repro.train.engine import Engine, ReferenceEngine, StepValue
from fp4repro.train.lock import run_lock
from fp4repro.train.phases import PhaseSeconds
from fp4repro.train.profiling import ProfileWindow, StepProfiler
from fp4repro.train.runs import RunFolder, changed_fields, check_owner, list_runs, run_fingerprint, run_owner
from fp4repro.train.schedule import WSDSchedule
from fp4repro.train.space import CheckpointSizes, check_free_space, checkpoints_to_write
from fp4repro.util import deterministic_algorithms

METRICS = ["step", "tokens", "stage", "loss", "lr", "grad_norm", "tokens_per_s", "attempt"]
TELEMETRY = [
    "step",
    "layer",
    "operand",
    "steps_since_refresh",
    "blocks",
    "saturated_blocks",
    "underflow_blocks",
    "nonzero_elements",
    "zeroed_elements",
    "clipped_elements",
    "nonfinite_blocks",
    "sq_error",
    "sq_norm",
    "amax_ratio",
    "rel_error",
    "target",
]


class NonFiniteLoss(FP4ReproError):
    """The loss or the gradient norm became NaN or inf; the message names the worst operands,
    ``rows`` are the failing step's telemetry."""

    def __init__(self, message: str, rows: list[dict], step: int):
        super().__init__(message)
        self.rows, self.step = list(rows), step


@dataclass(frozen=True)
class LaunchedStep:
    """A step the engine has launched (``step`` from 0): its loss and norm may still be on the
    device; ``clock``: when its seconds start (its launch, or the read of the step before it)."""

    step: int
    stage: str
    batch: torch.Tensor
    loss: StepValue
    grad_norm: StepValue
    lr: float
    clock: float


@dataclass(frozen=True)
class StepPlan:
    """Where each optimizer step sits: its stage and its index within that stage."""

    stage_of_step: tuple[int, ...]
    first_step_of_stage: tuple[int, ...]

    @classmethod
    def build(cls, stage_steps: list[int]) -> StepPlan:
        stage_of_step, first = [], []
        for i, n in enumerate(stage_steps):
            first.append(len(stage_of_step))
            stage_of_step += [i] * n
        return cls(tuple(stage_of_step), tuple(first))


def eval_checkpoint_steps(total_steps: int, count: int) -> list[int]:
    """Steps after which evaluation checkpoints are saved: ``count`` points evenly spaced in
    tokens (every step has the same tokens), the last one at the end of training."""
    return sorted({max(1, round(i * total_steps / count)) for i in range(1, count + 1)})


def saved_checkpoint_steps(study: Study, seed: int) -> list[int]:
    """The evaluation checkpoints a run of ``seed`` saves: every one of ``eval_checkpoint_steps``
    for a seed whose every checkpoint is evaluated (``eval.curve_seeds``), else only the final one
    (the only one its evaluation reads; the others would cost their writing time and disk)."""
    t = study.experiment.train
    steps = eval_checkpoint_steps(t.total_steps, t.checkpoints)
    return steps if study.experiment.eval.every_checkpoint(seed) else steps[-1:]


def _worst_operands(rows: list[dict], n: int = 5) -> str:
    ranked = sorted(rows, key=lambda r: (r["nonfinite_blocks"], r["saturated_blocks"]), reverse=True)[:n]
    return "; ".join(
        f"{r['layer']}.{r['operand']}: {r['nonfinite_blocks']} non-finite, "
        f"{r['saturated_blocks']} saturated of {r['blocks']} blocks"
        for r in ranked
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _announce(run: RunFolder, numerics: dict, start_step: int, total_steps: int) -> None:
    """Say which run this is, and whether it resumes, starts fresh, or starts beside other runs."""
    where = f"{run.out}: run {run.relative(run.path)}"
    if start_step:
        _say(f"{where}: resuming from step {start_step} of {total_steps}")
        return
    others = [r for r in list_runs(run.out) if r.fingerprint != run.fingerprint and r.record()]
    if not others:
        _say(f"{where}: starting at step 0 of {total_steps}")
        return
    newest = max(others, key=lambda r: r.record_path.stat().st_mtime)
    changed = changed_fields(newest.record()["numerics"], numerics)
    _say(
        f"{where}: starting at step 0 of {total_steps}: the config changes the numbers "
        f"({', '.join(changed) or 'fingerprint'} differ from {run.relative(newest.path)}); "
        f"{len(others)} other run(s) of this recipe are kept in {run.relative(run.out / 'runs')}/ "
        "(`fp4repro runs --prune` removes them)"
    )


def _retire_finished_outputs(out_dir: Path, fingerprint: str) -> None:
    """A run of another config starts: the folder's finished-run outputs stop describing it. They
    are removed (the old run's folder keeps its checkpoints and parts), so that nothing reads a
    finished run's done.json beside another run's tables."""
    done = out_dir / "done.json"
    if not done.is_file() or json.loads(done.read_text()).get("fingerprint") == fingerprint:
        return
    for name in ("done.json", "metrics.parquet", "telemetry.parquet"):
        (out_dir / name).unlink(missing_ok=True)
    _say(
        f"{out_dir}: done.json and the tables of the finished run of another config were removed "
        "(its run folder and checkpoints stay)"
    )


def choose_deterministic_mode() -> None:
    """Deterministic algorithms only: torch's (with cuBLAS's workspace) and mamba-ssm's. Chosen
    before anything imports megatron-core, which imports mamba-ssm, whose kernels fix their
    launch configs at import: imported first, they autotune per process and two processes of the
    same run part after a few steps."""
    deterministic_algorithms()
    deterministic_mamba_ssm()


def build_engine(
    study: Study,
    recipe_name: str,
    seed: int,
    device: str,
    schedule: WSDSchedule,
    deterministic: bool = False,
    initial: dict | None = None,
) -> Engine:
    """The experiment's backend for one run: the reference model here, or megatron-core's model
    (``fp4repro.megatron.engine``, imported only then: importing megatron-core takes seconds);
    ``initial``: the weights it starts from (reference layout), else the seed's initialization."""
    recipe = study.recipe(recipe_name)
    if deterministic:
        choose_deterministic_mode()
    if study.experiment.backend == "megatron":
        from fp4repro.megatron.engine import MegatronEngine

        return MegatronEngine(study, recipe, seed, schedule, deterministic=deterministic, initial=initial)
    return ReferenceEngine(study, recipe, seed, device, schedule, initial=initial)


def initial_weights(study: Study, path: Path) -> tuple[dict, str]:
    """(weights, sha256) of an evaluation checkpoint a run starts from, checked (its digest, its
    model config, its tensors) before any compute."""
    ckpt = load_checkpoint(Path(path))
    model = study.experiment.model
    if ckpt.get("model_config") != model:
        raise FP4ReproError(
            f"{path}: written for model config {ckpt.get('model_config')!r}, but experiment "
            f"{study.name!r} trains {model!r}"
        )
    if problems := state_dict_mismatch(ckpt["model"], study.model):
        raise FP4ReproError(f"{path}: its weights do not fit model {model!r}: " + "; ".join(problems))
    return ckpt["model"], Path(f"{path}.sha256").read_text().strip()


def train(
    study: Study,
    recipe_name: str,
    data_dir: Path,
    out_dir: Path,
    seed: int | None = None,
    device: str | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    deterministic: bool = False,
    init_from: Path | None = None,
    profile: ProfileWindow | None = None,
    profile_out: Path | None = None,
) -> Path:
    """Train (or resume) the run of one recipe and one seed of a study; returns ``out_dir``.

    seed: sets initialisation and data order (default: the experiment's first seed); the same seed
    gives every recipe the same batches, so recipes compare paired by seed.
    stop_after: end after this many optimizer steps in total (for tests and dry runs); the run
    stays resumable and is not marked done.
    deterministic: deterministic algorithms only (torch's, cuBLAS's, megatron's), so that a
    resumed GPU run repeats an uninterrupted one bit for bit (slower).
    init_from: an evaluation checkpoint (of either backend's run: both write the reference layout)
    to start from instead of the seed's initialization; its digest enters the run's fingerprint.
    profile: profile these steps (``fp4repro.train.profiling``), every one of which this process
    must train; the record goes to ``profile_out`` (default ``out_dir/profile.json``).

    Before any compute: ``out_dir`` must not hold another recipe's or seed's run, the data's token
    files must have the digests its manifest records, and the filesystem must have room for the
    checkpoints (``fp4repro.train.space``). The process that writes the run's files then holds
    ``out_dir``'s lock while it trains (a second training of the folder stops at once).
    """
    started = time.perf_counter()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    exp, t = study.experiment, study.experiment.train
    seed = study.seeds_of(recipe_name)[0] if seed is None else int(seed)
    out_dir = Path(out_dir)

    # ---- this config's run folder, and what must hold before it computes anything
    if deterministic:  # first: refuse_here's import below imports megatron-core, and with it mamba-ssm
        choose_deterministic_mode()
    if exp.backend == "megatron":  # a machine it cannot train on is said before any data is read
        from fp4repro.megatron.engine import refuse_here

        refuse_here(study)
    initial, init_digest = initial_weights(study, init_from) if init_from is not None else (None, None)
    manifest = load_manifest(data_dir)
    numerics, fingerprint = run_fingerprint(study, recipe_name, seed, manifest.data_hash, init_digest)
    run = RunFolder(out_dir, fingerprint)
    end_step = t.total_steps if stop_after is None else min(t.total_steps, stop_after)
    if profile is not None:  # from the newest resume checkpoint on disk: the engine may fall back to an older one
        profile.check(run.resume_step() + 1, end_step)
    check_owner(out_dir, run_owner(exp.name, study.recipe(recipe_name).name, seed))
    verify_token_files(manifest, run.path / VERIFIED)
    _check_space(study, recipe_name, seed, run, end_step)

    # ---- model, optimizer, schedule: all a function of the config and the seed
    schedule = WSDSchedule.of(t)
    engine = build_engine(study, recipe_name, seed, device, schedule, deterministic, initial)
    profiler = None
    if profile is not None:
        out = Path(profile_out) if profile_out is not None else out_dir / "profile.json"
        profiler = StepProfiler.of_run(profile, out, engine, study, recipe_name, seed, fingerprint, device)
    with run_lock(out_dir) if engine.writer else contextlib.nullcontext():
        return _train(
            study,
            recipe_name,
            seed,
            engine,
            manifest,
            data_dir,
            run,
            numerics,
            end_step,
            device,
            progress,
            started,
            profiler,
        )


def _check_space(study: Study, recipe_name: str, seed: int, run: RunFolder, end_step: int) -> None:
    """Room on the run folder's filesystem for the checkpoints the run will write from where it
    resumes (the newest resume checkpoint on disk) to ``end_step``."""
    t = study.experiment.train
    evaluations, resumes = checkpoints_to_write(
        run.resume_step(),
        end_step,
        set(saved_checkpoint_steps(study, seed)),
        t.resume_every,
        len(resume_checkpoints(run.resume)) + len(resume_dirs(run.resume)),
    )
    check_free_space(run.out, CheckpointSizes.of(study, recipe_name), evaluations, resumes)


def _train(
    study: Study,
    recipe_name: str,
    seed: int,
    engine: Engine,
    manifest: Manifest,
    data_dir: Path,
    run: RunFolder,
    numerics: dict,
    end_step: int,
    device: str,
    progress: bool,
    started: float,
    profiler: StepProfiler | None = None,
) -> Path:
    """The run ``train`` checked and built the engine of, up to ``end_step``; returns its ``out_dir``.
    ``started``: when ``train`` was called (``time.perf_counter``), for the phases' seconds;
    ``profiler``: profiles its window of steps."""
    exp, t = study.experiment, study.experiment.train
    out_dir = run.out
    state, writer = engine.quant_state, engine.writer
    recipe = study.recipe(recipe_name)
    plan = StepPlan.build(t.stage_steps())
    data = RunSampler.of_run(manifest, t, seed, cache_dir=data_dir / "cache")
    samplers = data.stages
    eval_steps = set(saved_checkpoint_steps(study, seed))
    refreshes = refresh_steps_of(study, recipe_name)  # telemetry at the amax samples too, where asked

    # ---- resumed where its last attempt left off
    if writer:
        _retire_finished_outputs(out_dir, run.fingerprint)
    start_step = engine.load_resume(run.resume)
    if profiler is not None:
        profiler.window.check(start_step + 1, end_step)
    # runs pair only on the same corpus and numerics (fp4repro.config.numerics)
    recorded = numerics_record(recipe, study.model.layer_linears)
    origin = {**provenance(device), "data": manifest.data_hash, **recorded}
    attempt = 0
    if writer:
        run.drop_parts_after(start_step)
        _announce(run, numerics, start_step, t.total_steps)
        if repeats := data.repeats():
            _say(f"{run.out}: warning: {repeats}: the corpus is too small for the run's tokens")
        attempt = run.start_attempt(numerics, start_step, origin, run_owner(exp.name, recipe.name, seed))
    metrics: list[dict] = []  # rows since the last part
    telemetry: list[dict] = []
    seconds = PhaseSeconds(setup=time.perf_counter() - started)
    checkpoints = CheckpointWriter()  # in the background: done.json is written after its last write

    def write_parts(step: int) -> None:
        nonlocal metrics, telemetry
        for kind, rows, columns in (("metrics", metrics, METRICS), ("telemetry", telemetry, TELEMETRY)):
            if rows and writer:
                run.write_part(kind, step, rows, columns, origin)
        metrics, telemetry = [], []

    def save_resume(step: int) -> None:
        write_parts(step)
        engine.save_resume(
            run.resume,
            step,
            {"recipe": recipe.name, "experiment": exp.name, "fingerprint": run.fingerprint},
            checkpoints,
        )

    def checkpoints_written() -> None:
        """Wait for the background checkpoint writes (their seconds count as the checkpoints')."""
        waiting = time.perf_counter()
        checkpoints.wait()
        seconds.checkpoints += time.perf_counter() - waiting

    def write_tables() -> None:
        if writer:
            write_table(out_dir / "metrics.parquet", run.assemble("metrics", METRICS), origin)
            write_table(out_dir / "telemetry.parquet", run.assemble("telemetry", TELEMETRY), origin)

    def write_done(last_step: int, diverged: dict | None = None) -> None:
        """done.json: the run has ended, after ``last_step`` steps (all of them, or a divergence)."""
        if writer:
            write_json(
                out_dir / "done.json",
                {
                    "experiment": exp.name,
                    "recipe": recipe.name,
                    "seed": seed,
                    "recipe_files": [recorded_name(f) for f in recipe.files],
                    "backend": exp.backend,
                    "fingerprint": run.fingerprint,
                    **recorded,
                    "deterministic": torch.are_deterministic_algorithms_enabled(),
                    "steps": last_step,
                    "tokens": last_step * t.tokens_per_step,
                    "diverged": diverged,
                    "checkpoints": sorted(
                        run.relative(run.ckpt / f"step_{s:08d}.pt") for s in eval_steps if s <= last_step
                    ),
                    "process_seconds": seconds.record(time.perf_counter() - started),
                },
                origin,
            )

    bar = tqdm(
        total=t.total_steps,
        initial=start_step,
        disable=not (progress and writer),
        unit="step",
        desc=f"{exp.name}/{recipe_name}/seed{seed}",
        dynamic_ncols=True,
        file=sys.stderr,
    )
    pending: LaunchedStep | None = None  # the step launched last: its loss and norm not read yet
    last_read = 0.0  # when the host last read a step (each step's clock starts there or at its launch)
    sampling = refresh_intervals(recipe, study.model)  # every one the recipe uses (telemetry or not)

    def finish(launched: LaunchedStep) -> None:
        """Read a launched step's loss and norm (waiting for its kernels) and record it, with the
        seconds from its clock's start to this read; a non-finite one ends the run, diagnosed on
        the step's batch."""
        nonlocal last_read
        loss, grad_norm = float(launched.loss), float(launched.grad_norm)
        last_read = time.perf_counter()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise NonFiniteLoss(*_diagnose(engine, launched.batch, launched.step, loss, grad_norm), step=launched.step)
        elapsed = last_read - launched.clock
        seconds.add_step(elapsed)
        tokens_per_s = t.tokens_per_step / elapsed
        metrics.append(
            {
                "step": launched.step + 1,
                "tokens": (launched.step + 1) * t.tokens_per_step,
                "stage": launched.stage,
                "loss": loss,
                "lr": launched.lr,
                "grad_norm": grad_norm,
                "tokens_per_s": tokens_per_s,
                "attempt": attempt,
            }
        )
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", stage=launched.stage)

    try:
        for step in range(start_step, end_step):
            if profiler is not None:
                profiler.before(step)
            began = time.perf_counter()
            stage = plan.stage_of_step[step]
            batch = samplers[stage].batch((step - plan.first_step_of_stage[stage]) * t.batch_size, t.batch_size)
            state.telemetry = is_telemetry_step(step, t.telemetry_every, refreshes)

            # the GPU runs this step while the host reads the one before (one step of lag, no stop)
            loss, grad_norm, lr = engine.step(step, batch)
            if pending is not None:
                finish(pending)
                pending = None
            launched = LaunchedStep(step, t.stages[stage].name, batch, loss, grad_norm, lr, max(began, last_read))
            state.advance()
            telemetry.extend(state.pop_telemetry())
            done = step + 1
            checkpoint = done in eval_steps or done % t.resume_every == 0 or done == end_step
            # read at once: an engine that returned floats has waited already; a checkpoint holds finite
            # steps only; and before a step that samples a fresh amax, so that a failure's redo
            # quantizes with the amax the failing step held
            if not isinstance(loss, torch.Tensor) or checkpoint or samples_amax(done, sampling):
                finish(launched)
            else:
                pending = launched

            if profiler is not None:
                profiler.after(step, time.perf_counter() - began, state.telemetry)
            saving = time.perf_counter()
            if done in eval_steps:
                weights = engine.eval_state_dict()
                if writer:
                    checkpoints.save(
                        {
                            "model": weights,
                            "step": done,
                            "tokens": done * t.tokens_per_step,
                            "stage": t.stages[stage].name,
                            "model_config": exp.model,
                            "recipe": recipe.name,
                            "recipe_config": recipe.config,
                            "experiment": exp.name,
                            "seed": seed,
                            "backend": exp.backend,
                            "fingerprint": run.fingerprint,
                        },
                        run.ckpt / f"step_{done:08d}.pt",
                    )
            if done % t.resume_every == 0 or done == end_step:
                save_resume(done)
            seconds.checkpoints += time.perf_counter() - saving
    except NonFiniteLoss as err:
        failed = err.step
        telemetry = [row for row in telemetry if row["step"] < failed] + err.rows  # the redo's rows replace the step's
        checkpoints_written()
        write_parts(failed + 1)  # the steps before the failure and the failing step's telemetry (a part
        # of its own: the one of step ``failed`` may be a resume checkpoint's)
        write_tables()
        write_done(failed, {"step": failed + 1, "reason": str(err)})
        _say(
            f"{run.out}: diverged: {err}. Kept as the run's result: metrics and telemetry (the failing step's "
            f"too) in {out_dir}, done.json says where it diverged"
        )
        return out_dir
    except BaseException:
        checkpoints.wait_quietly()  # before the run folder's lock is released
        raise
    finally:
        bar.close()
        if profiler is not None:
            profiler.close()

    checkpoints_written()  # a --stop-after run's last resume checkpoint too: the next attempt reads it
    if end_step == t.total_steps:
        write_tables()
        write_done(end_step)
    return out_dir


def _diagnose(engine: Engine, batch: torch.Tensor, step: int, loss: float, grad_norm: float) -> tuple[str, list]:
    """Redo the failing step with telemetry on: (a message naming the operands with the most
    non-finite and saturated blocks, the step's telemetry rows). The step may have been read after
    the next was launched: the engine then updated no parameter after the failure (the reference
    engine skips on the device), the loop reads at once before a step that samples a fresh amax,
    and the quantization state restarts the failing step, so that the redo quantizes as it did."""
    message = (
        f"step {step + 1}: non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} "
        f"(loss {loss}, grad norm {grad_norm})"
    )
    state = engine.quant_state
    state.pop_telemetry()
    state.restart_step(step)
    state.telemetry = True
    engine.forward_backward(batch)
    rows = state.pop_telemetry()
    return message + ("; worst operands: " + _worst_operands(rows) if rows else "; the recipe quantizes nothing"), rows

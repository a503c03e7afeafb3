"""The backends' loss curves side by side: the reference engine and the megatron engine trained for
a few steps from the same initial weights on the same batches (one GPU), beside two yardsticks of
how far two correct reference runs drift apart.

The batches are the experiment's first steps (its first stage's sampler, the run's seed), handed to
every engine as tensors. Four runs per recipe, each ``steps`` optimizer steps with the run's WSD
schedule and AdamW:

    reference   the reference engine (``fp4repro.train.engine.ReferenceEngine``)
    again       the same, a second time: what nondeterministic reductions alone change
                (zero when every kernel on the path is deterministic)
    yardstick   the reference with its torch SSD scan instead of mamba-ssm's Triton kernel: the
                same math rounded differently (``fp4repro.megatron.parity``)
    megatron    the megatron engine (``fp4repro.megatron.engine.MegatronEngine``)

The comparison: max over steps of |megatron − reference| against 3× the larger of the two
yardsticks' max |· − reference|. A non-finite loss in any curve makes its gap infinite and the
comparison fail (the reference engine with fused AdamW skips every update after one: its failure
flag stays set, as a training run stops there).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fp4repro.config.study import Study
from fp4repro.data import RunSampler, load_manifest
from fp4repro.model import use_torch_ssd
from fp4repro.train.engine import ReferenceEngine
from fp4repro.train.schedule import WSDSchedule

FACTOR = 3.0


def first_batches(study: Study, data_dir: Path, steps: int, seed: int) -> list[torch.Tensor]:
    """The first ``steps`` global batches of a run of ``study`` with ``seed`` (those of its training)."""
    t = study.experiment.train
    if steps > t.stage_steps()[0]:
        raise ValueError(f"{steps} steps: the first stage of {study.name} has {t.stage_steps()[0]}")
    run = RunSampler.of_run(load_manifest(data_dir), t, seed, cache_dir=data_dir / "cache")
    return [run.stages[0].batch(i * t.batch_size, t.batch_size) for i in range(steps)]


def _yardstick_engine(study: Study, recipe, seed: int, schedule) -> ReferenceEngine:
    engine = ReferenceEngine(study, recipe, seed, "cuda", schedule)
    use_torch_ssd(engine.model)
    return engine


def _curve(engine, batches: list[torch.Tensor]) -> list[float]:
    losses = []
    for step, batch in enumerate(batches):
        loss, _, _ = engine.step(step, batch)
        engine.quant_state.advance()
        losses.append(loss)
    return [float(loss) for loss in losses]  # read once the curve is launched


def loss_curves(study: Study, recipe: str, batches: list[torch.Tensor], seed: int) -> dict:
    """The four curves of the module docstring for one recipe, and the comparison."""
    from fp4repro.megatron.engine import MegatronEngine

    t = study.experiment.train
    schedule = WSDSchedule.of(t)
    r = study.recipe(recipe)
    makers = {
        "reference": lambda: ReferenceEngine(study, r, seed, "cuda", schedule),
        "again": lambda: ReferenceEngine(study, r, seed, "cuda", schedule),
        "yardstick": lambda: _yardstick_engine(study, r, seed, schedule),
        "megatron": lambda: MegatronEngine(study, r, seed, schedule),
    }
    curves = {}
    for name, make in makers.items():
        engine = make()
        curves[name] = _curve(engine, batches)
        del engine
        torch.cuda.empty_cache()
    return {"recipe": recipe, "steps": len(batches), "curves": curves, **compare(curves)}


def compare(curves: dict[str, list[float]]) -> dict:
    """max over steps of |curve − reference| for each other curve; the band (``FACTOR`` × the larger
    of the two yardsticks'), and whether the megatron curve is within it."""
    ref = curves["reference"]

    def max_gap(curve: list[float]) -> float:
        gaps = [abs(a - b) for a, b in zip(curve, ref, strict=True)]
        # Python's max passes over a NaN that is not first: a diverged curve would look close
        return max(gaps) if all(math.isfinite(g) for g in gaps) else math.inf

    gap = {name: max_gap(curves[name]) for name in ("again", "yardstick", "megatron")}
    band = FACTOR * max(gap["again"], gap["yardstick"])
    return {"max_difference": gap, "band": band, "within": math.isfinite(band) and gap["megatron"] <= band}


def table_header(study: Study, steps: int) -> str:
    t = study.experiment.train
    return (
        f"{study.name}: {steps} steps of {t.batch_size} x {t.seq_len} tokens; max over steps of |loss - "
        f"reference loss|; band = {FACTOR:g} x the larger yardstick\n"
        f"{'recipe':12} {'megatron':>10} {'again':>10} {'torch SSD':>10} {'band':>10}  within"
    )


def table_row(row: dict) -> str:
    g = row["max_difference"]
    return (
        f"{row['recipe']:12} {g['megatron']:>10.2e} {g['again']:>10.2e} {g['yardstick']:>10.2e} "
        f"{row['band']:>10.2e}  {'yes' if row['within'] else 'NO'}"
    )

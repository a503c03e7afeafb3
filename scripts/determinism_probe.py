"""One process's training curve on the ``small`` experiment's model and batch shape (8 x 2,048
tokens a step) with fixed random batches, for comparing two processes bit for bit. Prints one
JSON line: the losses as hex floats, a digest of the final weights and the median tokens/s after
step 5; with STEPS 0, the parameters whose gradients move between three passes of one batch in
this process (``fp4repro.train.repeatability``). Results: results/bench/determinism/.

Usage: python scripts/determinism_probe.py BACKEND RECIPE STEPS {fast|deterministic}
"""

import hashlib
import json
import statistics
import sys
import time
from dataclasses import replace

import torch

from fp4repro.config.experiment import load_experiment
from fp4repro.config.study import load_study
from fp4repro.train.loop import build_engine
from fp4repro.train.repeatability import unrepeatable_gradients
from fp4repro.train.schedule import WSDSchedule


def main(backend: str, recipe: str, steps: int, mode: str) -> dict:
    study = load_study(replace(load_experiment("small"), recipes=(recipe,), backend=backend, imported=False))
    t = study.experiment.train
    schedule = WSDSchedule(1e-3, max(steps, 5), 0, 1, 0.1)
    engine = build_engine(study, recipe, 0, "cuda", schedule, deterministic=mode == "deterministic")
    g = torch.Generator().manual_seed(20261203)
    row = {"backend": backend, "recipe": recipe, "mode": mode}
    if steps == 0:
        batch = torch.randint(0, study.model.vocab_size, (t.batch_size, t.seq_len + 1), generator=g)
        engine.forward_backward(batch)
        return row | {"moved": unrepeatable_gradients(engine, batch, repeats=3)}
    losses, rates = [], []
    for step in range(steps):
        batch = torch.randint(0, study.model.vocab_size, (t.batch_size, t.seq_len + 1), generator=g)
        engine.quant_state.telemetry = step % t.telemetry_every == 0
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss, _, _ = engine.step(step, batch)
        torch.cuda.synchronize()
        rates.append(t.batch_size * t.seq_len / (time.perf_counter() - start))
        engine.quant_state.advance()
        engine.quant_state.pop_telemetry()
        losses.append(float(loss).hex())
    digest = hashlib.sha256()
    for name, p in sorted(engine.model.named_parameters()):
        digest.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    return row | {"losses": losses, "weights": digest.hexdigest()[:16], "tok_s": statistics.median(rates[5:])}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])))

"""One process's training curve at the small model's shape on fixed random batches, for comparing
two processes bit for bit: prints one JSON line (losses as hex floats, a digest of the final
weights, median tokens/s; with STEPS 0, the gradients that move between three passes of one batch).
Usage: determinism_probe.py BACKEND RECIPE STEPS {fast|deterministic}"""

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "train"))
from test_repeatability_gpu import EXPERIMENT  # noqa: E402

from fp4repro.config.study import load_study  # noqa: E402
from fp4repro.model import use_torch_ssd  # noqa: E402
from fp4repro.train.loop import build_engine  # noqa: E402
from fp4repro.train.repeatability import unrepeatable_gradients  # noqa: E402
from fp4repro.train.schedule import WSDSchedule  # noqa: E402

backend, recipe, steps, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
path = Path(tempfile.mkdtemp()) / "probe.yaml"
path.write_text(EXPERIMENT.format(backend=backend))
study = load_study(path)
engine = build_engine(study, recipe, 0, "cuda", WSDSchedule(1e-3, max(steps, 5), 0, 1, 0.1), mode == "deterministic")
if os.environ.get("PROBE_SSD") == "torch":
    use_torch_ssd(engine.model)
grad_digests = []
plain_step = engine.optimizer.step


def digesting_step(*args, **kwargs):
    grad_digests.append(
        {n: zlib.crc32(p.grad.float().cpu().numpy().tobytes()) for n, p in engine.model.named_parameters()}
    )
    return plain_step(*args, **kwargs)


if os.environ.get("PROBE_GRADS") == "1":
    engine.optimizer.step = digesting_step
g = torch.Generator().manual_seed(20261203)
if steps == 0:
    batch = torch.randint(0, study.model.vocab_size, (8, 2049), generator=g)
    engine.forward_backward(batch)
    moved = unrepeatable_gradients(engine, batch, repeats=3)
    print(json.dumps({"backend": backend, "recipe": recipe, "mode": mode, "moved": moved}))
    sys.exit(0)
losses, rates = [], []
for step in range(steps):
    batch = torch.randint(0, study.model.vocab_size, (8, 2049), generator=g)
    engine.quant_state.telemetry = step % 29 == 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss, _, _ = engine.step(step, batch)
    torch.cuda.synchronize()
    rates.append(8 * 2048 / (time.perf_counter() - t0))
    engine.quant_state.advance()
    engine.quant_state.pop_telemetry()
    losses.append(float(loss).hex())
digest = hashlib.sha256()
for name, p in sorted(engine.model.named_parameters()):
    digest.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
print(
    json.dumps(
        {
            "backend": backend,
            "recipe": recipe,
            "mode": mode,
            "losses": losses,
            "weights": digest.hexdigest()[:16],
            "tok_s": statistics.median(rates[5:]),
            "grads": grad_digests,
        }
    )
)

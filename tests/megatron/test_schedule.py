"""megatron's OptimizerParamScheduler set up by ``wsd_scheduler`` gives every step the reference's
learning rate (``fp4repro.train.schedule.WSDSchedule``), at the stage-free edges too."""

import pytest
import torch

from fp4repro.megatron.schedule import wsd_scheduler
from fp4repro.train.schedule import WSDSchedule


@pytest.mark.parametrize(
    "total, warmup, decay",
    [(1000, 10, 200), (30201, 302, 6040), (50, 1, 10), (50, 0, 10), (50, 5, 0), (7, 2, 7), (40, 39, 1)],
)
def test_every_step_has_the_reference_learning_rate(total, warmup, decay):
    reference = WSDSchedule(peak_lr=8e-4, total_steps=total, warmup_steps=warmup, decay_steps=decay, min_lr_ratio=0.01)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0, weight_decay=0.5)
    scheduler = wsd_scheduler(optimizer, 8e-4, total, warmup, decay, 0.01, weight_decay=0.1)
    for step in range(total):
        got = optimizer.param_groups[0]["lr"]
        assert got == pytest.approx(reference(step), rel=1e-12, abs=0), step
        assert optimizer.param_groups[0]["weight_decay"] == 0.1
        scheduler.step(1)

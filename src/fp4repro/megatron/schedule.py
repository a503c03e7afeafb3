"""The reference's warmup-stable-decay schedule (``fp4repro.train.schedule``) as megatron-core's
``OptimizerParamScheduler``, step for step.

megatron's scheduler holds n, the optimizer steps taken, and sets the LR of step n:

    warmup (n <= Wm):   init + (max - init) · n / Wm
    WSD    (n > Wm):    min + (max - min) · c,  c = 1 up to n = S - D, then (S - n) / D

The reference's step n has peak · (n + 1) / W in warmup, then peak, then peak · (r + (1 - r) ·
(S - n) / D) over the last D steps. With Wm = W - 1 and init = peak / W the warmups agree
(peak / W + peak · (1 - 1/W) · n / (W - 1) = peak · (n + 1) / W), ending at peak on step W - 1 in
both; max = peak, min = r · peak, decay over S steps with the last D annealed give the rest. W = 1
is no warmup in megatron's terms (Wm = 0: its first step is already at peak, as the reference's).
Weight decay is constant.
"""

from __future__ import annotations


def wsd_scheduler(
    optimizer,
    peak_lr: float,
    total_steps: int,
    warmup_steps: int,
    decay_steps: int,
    min_lr_ratio: float,
    weight_decay: float,
):
    """megatron's scheduler for ``optimizer`` with the reference's WSD schedule; call its
    ``step(1)`` after every optimizer step (its state_dict goes into checkpoints)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    megatron_warmup = max(warmup_steps - 1, 0)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=peak_lr / warmup_steps if warmup_steps > 1 else peak_lr,
        max_lr=peak_lr,
        min_lr=min_lr_ratio * peak_lr,
        lr_warmup_steps=megatron_warmup,
        lr_decay_steps=total_steps,
        lr_decay_style="WSD",
        wsd_decay_steps=decay_steps,
        lr_wsd_decay_style="linear",
        start_wd=weight_decay,
        end_wd=weight_decay,
        wd_incr_steps=total_steps,
        wd_incr_style="constant",
    )

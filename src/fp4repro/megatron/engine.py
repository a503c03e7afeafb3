"""The megatron backend's engine for the training loop (``fp4repro.train.loop``): megatron-core's
hybrid model wrapped in its DDP, its distributed optimizer (AdamW), its ``OptimizerParamScheduler``
with the reference's WSD schedule, its forward-backward schedule, and ``dist_checkpointing``.

One process per GPU (torchrun or Slurm; alone, a group of one). The run starts from the
reference model's initialization for the seed (built on the CPU and converted,
``fp4repro.megatron.convert``), so a seed gives both backends the same initial weights. Every
data-parallel rank takes its slice of the loop's global batch and splits it into micro-batches
(``parallel.micro_batch``); the loss of a micro-batch is its mean next-token cross-entropy
(megatron's vocab-parallel cross-entropy in FP32 under BF16 autocast, parameters in FP32, as the
reference trains), the step's loss their mean over micro-batches and ranks.

An optimizer step, as megatron's ``ChainedOptimizer.step`` takes it, in its parts: the gradients
are prepared and their norm taken first, so that a non-finite loss or norm leaves the parameters
as they were (the loop then diagnoses the step on them), then clipping and AdamW.

Resume checkpoints (``fp4repro.megatron.resume``) hold the model and the optimizer sharded
(torch_dist, the distributed optimizer's state fully reshardable), and in common the scheduler
and the step; per rank, as one sharded object each, its ``QuantState`` and its random generators
(torch, CUDA, Python, NumPy and megatron's CUDA RNG tracker): a resume restores every rank as it
was, on the same number of processes. Each periodic refresh's fresh amax and each automatic
target's growth are MAX-reduced over the ranks that hold the same tensors (``QuantState.reduce_max``):
the data-parallel ranks, and with ``tp_amax: group`` the tensor-parallel ones too (the shards of a
split operand then take the whole tensor's growth; the unsplit ones are equal anyway), so every
rank holds the same amaxes and picks the same T.

Tensor parallelism: each rank starts from its part of the converted initialization
(``fp4repro.megatron.shard``), the evaluation checkpoints gather the parts back into the whole
model (collective over the tensor group), the quantized linears reduce amaxes and place SR bits
over the group as ``parallel.tp_amax`` says (``attach_recipe``), and the resume checkpoints are
megatron's sharded ones. Pipeline parallelism is refused for now (the initialization and the
evaluation checkpoints are written for every layer on every rank).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch
import torch.distributed as dist

from fp4repro.config.recipe import Recipe
from fp4repro.config.study import Study
from fp4repro.errors import ConfigError, FP4ReproError
from fp4repro.megatron import resume
from fp4repro.megatron.clip_grads import clip_by_total_norm, total_grad_norm
from fp4repro.megatron.convert import from_megatron, to_megatron
from fp4repro.megatron.distributed import initialize
from fp4repro.megatron.model import attach_recipe, build_model
from fp4repro.megatron.schedule import wsd_scheduler
from fp4repro.megatron.shard import gather, shard
from fp4repro.model import NemotronH, compile_conv1d, compile_elementwise, deterministic_mamba_ssm
from fp4repro.quant.state import QuantState
from fp4repro.util import OPTIMIZER_PHASE, deterministic_algorithms, rng_state, set_rng_state

# the distributed optimizer's state in checkpoints: one tensor per parameter, whatever the layout
OPTIMIZER_CHECKPOINT = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}


def refuse_here(study: Study) -> None:
    """An error when this backend cannot train the study here: pipeline stages (not yet) or no
    CUDA device. The loop asks before it reads any data; the engine asks again when it is built."""
    exp = study.experiment
    if exp.parallel.pipeline != 1:
        raise ConfigError(
            f"{exp.path}: field 'parallel.pipeline': value {exp.parallel.pipeline}: training through "
            "megatron-core runs without pipeline parallelism for now (1)"
        )
    if not torch.cuda.is_available():
        raise FP4ReproError(
            f"{exp.path}: backend megatron trains on CUDA GPUs (megatron-core's DDP and "
            "checkpoints need them) and none is visible; the reference backend trains on a CPU"
        )


class MegatronEngine:
    def __init__(
        self,
        study: Study,
        recipe: Recipe,
        seed: int,
        schedule,
        deterministic: bool = False,
        initial: dict | None = None,
    ):
        """``schedule``: the run's WSD schedule (``fp4repro.train.schedule.WSDSchedule``); ``initial``:
        weights to start from in the reference model's layout (a reference checkpoint's) instead of
        the seed's initialization."""
        from megatron.core import parallel_state
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.pipeline_parallel import get_forward_backward_func

        exp, t, config = study.experiment, study.experiment.train, study.model
        refuse_here(study)
        if deterministic:  # build_engine chooses it before megatron-core is imported; here too for direct use
            deterministic_algorithms()
            deterministic_mamba_ssm()
        self.layout = initialize(exp.parallel, t.batch_size, seed)
        self.config, self.seq_len, self.grad_clip = config, t.seq_len, t.grad_clip

        torch.manual_seed(seed)
        if initial is None:
            initial = NemotronH(config, recipe).state_dict()  # on the CPU: the reference's initialization
        self.model = build_model(config, exp.parallel).cuda()
        self.model.load_state_dict(
            shard(
                to_megatron(initial, config),
                config,
                self.layout.tensor,
                parallel_state.get_tensor_model_parallel_rank(),
            ),
            strict=True,
        )
        del initial
        self.quant_state = QuantState(seed)
        # every rank (tensor x data; pipeline size 1) with tp_amax: group, else each shard's data-parallel replicas
        amax_group = None if exp.parallel.tp_amax == "group" else parallel_state.get_data_parallel_group()
        self.quant_state.reduce_max = functools.partial(_max_over, group=amax_group)
        attach_recipe(self.model, recipe, self.quant_state, config, exp.parallel.tp_amax)

        model_config = self.model.config
        model_config.deterministic_mode = deterministic
        self.ddp = DistributedDataParallel(
            config=model_config,
            module=self.model,
            ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True),
        )
        model_config.finalize_model_grads_func = finalize_model_grads
        model_config.no_sync_func = self.ddp.no_sync
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=t.lr,
                min_lr=t.lr * t.min_lr_ratio,
                weight_decay=t.weight_decay,
                adam_beta1=t.betas[0],
                adam_beta2=t.betas[1],
                adam_eps=1e-8,
                clip_grad=t.grad_clip,
                bf16=False,
                fp16=False,
                params_dtype=torch.float32,
                use_distributed_optimizer=True,
            ),
            [self.ddp],
        )
        if t.fused_kernels:
            _use_fused_adamw(self.optimizer)
            compile_elementwise(self.model)
        if t.compiled_conv1d:
            compile_conv1d(self.model)
        self.fused_kernels = t.fused_kernels
        self.scheduler = wsd_scheduler(
            self.optimizer,
            schedule.peak_lr,
            schedule.total_steps,
            schedule.warmup_steps,
            schedule.decay_steps,
            schedule.min_lr_ratio,
            t.weight_decay,
        )
        self.forward_backward_func = get_forward_backward_func()
        self.writer = dist.get_rank() == 0
        self.ddp.train()

    # ---------------------------------------------------------------------------------- steps
    def _local_batch(self, batch: torch.Tensor) -> torch.Tensor:
        """This data-parallel rank's rows of the global batch, on its GPU."""
        from megatron.core import parallel_state

        rows = self.layout.micro_batch * self.layout.accumulation
        rank = parallel_state.get_data_parallel_rank()
        return batch[rank * rows : (rank + 1) * rows].cuda(non_blocking=True)

    def _forward_backward(self, batch: torch.Tensor) -> float:
        """Forward and backward over this rank's micro-batches; the mean loss over all ranks."""
        from megatron.core import parallel_state

        def forward_step(data_iterator, model):
            tokens = next(data_iterator)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                per_token = model(tokens[:, :-1], position_ids=None, attention_mask=None, labels=tokens[:, 1:])
            return per_token, _mean_loss

        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        micro = iter(self._local_batch(batch).split(self.layout.micro_batch))
        losses = self.forward_backward_func(
            forward_step_func=forward_step,
            data_iterator=micro,
            model=[self.ddp],
            num_microbatches=self.layout.accumulation,
            seq_length=self.seq_len,
            micro_batch_size=self.layout.micro_batch,
        )
        loss = torch.stack([item["lm loss"] for item in losses]).mean()
        dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
        return loss.item() / parallel_state.get_data_parallel_world_size()

    def step(self, step: int, batch: torch.Tensor) -> tuple[float, float, float]:
        lr = self.optimizer.param_groups[0]["lr"]
        loss = self._forward_backward(batch)
        with torch.profiler.record_function(OPTIMIZER_PHASE):
            self.optimizer.prepare_grads()
            grad_norm = total_grad_norm(self.optimizer)
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                return loss, grad_norm, lr
            if self.grad_clip > 0:
                for part in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
                    grads = [p.grad for p in part.get_parameters() if p.grad is not None]
                    clip_by_total_norm(grads, max_norm=self.grad_clip, total_norm=grad_norm)
            self.optimizer.step_with_ready_grads()
            self.scheduler.step(increment=1)
        return loss, grad_norm, lr

    def forward_backward(self, batch: torch.Tensor) -> None:
        self._forward_backward(batch)

    # ---------------------------------------------------------------------------- checkpoints
    def eval_state_dict(self) -> dict:
        """The whole model in the reference layout (collective: the tensor group's parts gathered)."""
        from megatron.core import parallel_state

        local = {k: v.detach() for k, v in self.model.state_dict().items() if not k.endswith("._extra_state")}
        whole = gather(local, self.config, parallel_state.get_tensor_model_parallel_group(), keep=self.writer)
        return from_megatron(whole, self.config) if self.writer else {}

    def _sharded_state_dict(self, is_loading: bool) -> dict:
        from megatron.core import tensor_parallel
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        if is_loading:
            _give_adam_a_state(self.optimizer)
        model = self.model.sharded_state_dict()
        rank = {
            "rng": rng_state(),
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
            "quant_state": self.quant_state.state_dict(),
        }
        return {
            "model": model,
            "optimizer": self.optimizer.sharded_state_dict(model, is_loading=is_loading, metadata=OPTIMIZER_CHECKPOINT),
            "rank": ShardedObject("rank", rank, (dist.get_world_size(),), (dist.get_rank(),), replica_id=0),
        }

    def save_resume(self, folder: Path, step: int, meta: dict, writer) -> None:
        """Written here, collectively, after ``writer``'s writes (the loop's evaluation checkpoints:
        ``fp4repro.train.checkpoint.CheckpointWriter``) have ended: checkpoints land in order."""
        writer.wait()
        state = self._sharded_state_dict(is_loading=False)
        state.update(step=step, scheduler=self.scheduler.state_dict(), meta=meta)
        resume.save(state, folder, step)

    def load_resume(self, folder: Path) -> int:
        from megatron.core import tensor_parallel

        found = resume.load_newest(lambda: self._sharded_state_dict(is_loading=True), folder)
        if found is None:
            return 0
        state, step = found
        self.model.load_state_dict(state["model"], strict=True)
        _load_optimizer(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rank = state["rank"]
        self.quant_state.load_state_dict(rank["quant_state"])
        self.quant_state.to("cuda")
        set_rng_state(rank["rng"])
        tensor_parallel.get_cuda_rng_tracker().set_states(rank["tracker"])
        if self.fused_kernels:  # the loaded param groups and steps as fused AdamW reads them
            _use_fused_adamw(self.optimizer)
        return step


def _give_adam_a_state(optimizer) -> None:
    """Zero AdamW state (step 0, zero moments: what torch's AdamW creates at its first step) for
    every parameter that has none yet. Without Apex or Transformer Engine, megatron's distributed
    optimizer reads the step out of torch AdamW's per-parameter state when it builds the state dict
    that a checkpoint loads into, and a fresh AdamW has no state before its first step (megatron
    asserts, with no message). The load then overwrites all of it."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        adam = part.optimizer
        for group in adam.param_groups:
            for param in group["params"]:
                if not adam.state[param]:
                    adam.state[param] = {
                        "step": torch.tensor(0.0),
                        "exp_avg": torch.zeros_like(param),
                        "exp_avg_sq": torch.zeros_like(param),
                    }


def _use_fused_adamw(optimizer) -> None:
    """torch's fused AdamW for every torch AdamW in megatron's optimizer. Without Apex or Transformer
    Engine, megatron-core builds ``torch.optim.AdamW`` and passes no ``fused``; AdamW reads
    ``fused`` and ``foreach`` from each param group at every step, so they are set there. Fused
    AdamW keeps each parameter's step as a float32 tensor on the parameter's device (as it creates
    it); a step already held (a loaded checkpoint's) is moved there."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        adam = part.optimizer
        for group in adam.param_groups:
            group["fused"], group["foreach"] = True, False
            for param in group["params"]:
                if "step" in (state := adam.state.get(param, {})):
                    state["step"] = state["step"].to(device=param.device, dtype=torch.float32)


def _load_optimizer(optimizer, state: dict) -> None:
    """Load the distributed optimizer's checkpointed state (fully reshardable), around two faults
    of megatron-core 0.16.1's torch-AdamW path (no Apex or Transformer Engine): its parameter-state
    load copies into every entry of a parameter's AdamW state, the step too, which the checkpoint
    does not hold (KeyError: 'step'); and its non-parameter load gives every parameter one shared
    step tensor, which AdamW would increment once per parameter at each step. So: the param groups
    and the step first, then the parameter state with the steps set aside, then one step tensor per
    parameter."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    states = [state] if len(parts) == 1 else [v for _, v in sorted(state.items())]
    for part, part_state in zip(parts, states, strict=True):
        part_state = dict(part_state)
        param_state = part_state.pop("param_state")
        if (kind := part_state.pop("param_state_sharding_type")) != "fully_reshardable":
            raise FP4ReproError(
                f"optimizer state sharded as {kind!r}; resume checkpoints are written fully reshardable"
            )
        part.load_state_dict(part_state)
        steps = {
            param: adam_state.pop("step") for param, adam_state in part.optimizer.state.items() if "step" in adam_state
        }
        part.load_parameter_state_from_fully_reshardable(param_state)
        for param, step in steps.items():
            part.optimizer.state[param]["step"] = step.clone()


def _max_over(value: torch.Tensor, group=None) -> torch.Tensor:
    """The maximum of ``value`` over the ranks of ``group`` (None: all of them)."""
    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return value


def _mean_loss(per_token: torch.Tensor):
    """megatron's loss function for a micro-batch: its mean cross-entropy (the schedule divides by
    the number of micro-batches, DDP averages over data-parallel ranks)."""
    loss = per_token.float().mean()
    return loss, {"lm loss": loss.detach()}

"""Evaluation: held-out NLL, quantized-inference policies, the lm-eval adapter and offline tasks.

    evaluate(load_study("tiny"), "ue5m3")                    # every checkpoint x policy of a run
    model, ckpt = load_eval_model(path, "quantized")         # a checkpoint under a policy
    cold_start(model); ...; forward_order(model)             # the replay's cold start, the order seen since
    stream_nll(model, validation_tokens(manifest, "prose"), seq_len, batch_size)
    write_offline_tasks(data_dir, out_dir, n_items=200, seed=1234)
    FP4ReproLM.from_checkpoint(path, data=data_dir, policy="quantized")   # lm-eval model "fp4repro"

The lm-eval adapter is imported lazily (``fp4repro.eval.lm``), so that the rest works without lm-eval.
"""

from fp4repro.eval.errors import EvalError
from fp4repro.eval.loss import final_window_loss
from fp4repro.eval.nll import DocumentNLL, NLLResult, blend_nll, document_nll, stream_nll, windows
from fp4repro.eval.policy import (
    CheckpointInfo,
    build_model,
    cold_start,
    forward_order,
    inspect_checkpoint,
    load_eval_model,
)
from fp4repro.eval.run import evaluate
from fp4repro.eval.tasks import write_offline_tasks
from fp4repro.quant.replay import ReplayAmaxState  # the replay policy's state (re-exported)
from fp4repro.quant.state import CurrentAmaxState  # the quantized policy's state (re-exported)

__all__ = [
    "EvalError",
    "final_window_loss",
    "NLLResult",
    "DocumentNLL",
    "blend_nll",
    "document_nll",
    "stream_nll",
    "windows",
    "CheckpointInfo",
    "CurrentAmaxState",
    "ReplayAmaxState",
    "cold_start",
    "forward_order",
    "build_model",
    "inspect_checkpoint",
    "load_eval_model",
    "evaluate",
    "write_offline_tasks",
]

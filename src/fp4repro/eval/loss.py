"""Final-window training loss: the mean training loss over the last W of training tokens."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from fp4repro.eval.errors import EvalError
from fp4repro.results import METRICS_COLUMNS, read_table


def final_window_loss(metrics: pd.DataFrame | str | Path, window: float) -> dict:
    """Mean loss over the steps whose tokens fall in the last ``window`` fraction of training.

    ``metrics`` is a training run's metrics.parquet (columns step, tokens, stage, loss, …), one row
    per optimizer step with ``tokens`` counted after the step. The window holds the steps with
    tokens > (1 − window) · total tokens; its standard error treats the steps as independent
    (consecutive losses are correlated, so it is likely an underestimate).
    """
    if not 0 < window <= 1:
        raise EvalError(f"final_window {window!r}: must satisfy 0 < W <= 1")
    if isinstance(metrics, (str, Path)):
        metrics = read_table(Path(metrics), METRICS_COLUMNS, "a training metrics table (fp4repro train)", EvalError)
    df = metrics
    if df.empty:
        raise EvalError("final-window loss: the metrics table has no training steps")
    df = df.sort_values("step")
    total = int(df["tokens"].iloc[-1])
    tail = df[df["tokens"] > (1.0 - window) * total]
    losses = tail["loss"].to_numpy(dtype=np.float64)
    stderr = float(losses.std(ddof=1) / math.sqrt(len(losses))) if len(losses) > 1 else math.nan
    before = df.loc[df["tokens"] <= (1.0 - window) * total, "tokens"]
    return {
        "final_window": float(window),
        "loss": float(losses.mean()),
        "loss_stderr": stderr,
        "steps": int(len(losses)),
        "first_step": int(tail["step"].iloc[0]),
        "last_step": int(tail["step"].iloc[-1]),
        "tokens_from": int(before.iloc[-1]) if len(before) else 0,
        "tokens_to": total,
    }

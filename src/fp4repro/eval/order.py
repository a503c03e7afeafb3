"""The order of an evaluation's forwards, as a digest recorded beside its results (column ``order``).

Under the cold replay (``fp4repro.quant.replay``) a result depends on which batches the model saw
and in which order since its cold start: the authors make "batch size, request order, partial
final batches, and reset boundaries ... part of the experiment identity" (artifact
MrHuff/ue5m3-fp4, reproduce/docs/numerical_protocol.md, "Post-load quantized inference"; their
evaluator hashes each work unit's input in order, src/ue5m3_fp4/scaling/inference.py). Every
evaluation model carries a ``ForwardLog`` (``fp4repro.eval.policy.build_model``) that folds each
forward's token ids, with their shape, into a chain of SHA-256s from its cold start (``reset``): two
results with the same digest saw the same batches in the same order. The policies that hold no
amax give the same numbers in any order; their digest is recorded all the same.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

#: Hex digits of the digest written to the tables.
DIGITS = 16


class ForwardLog:
    """Forwards since the last ``reset`` and the digest of their inputs, in order."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.forwards = 0
        self._chain = ""  # hex SHA-256 of the previous link and this forward (a string: the log copies)

    def record(self, tokens: torch.Tensor) -> None:
        """Fold one forward's (batch, time) token ids into the digest."""
        ids = np.ascontiguousarray(tokens.detach().to("cpu", torch.int64).numpy())
        link = hashlib.sha256(f"{self._chain}:{self.forwards}:{list(ids.shape)}:".encode())
        link.update(ids.tobytes())
        self._chain = link.hexdigest()
        self.forwards += 1

    def hook(self, module: torch.nn.Module, args: tuple) -> None:
        """A forward pre-hook: records the forward's first argument (the token ids)."""
        self.record(args[0])

    @property
    def digest(self) -> str:
        """The order's identity: the number of forwards and the digest of their inputs."""
        return f"{self.forwards}:{(self._chain or hashlib.sha256().hexdigest())[:DIGITS]}"

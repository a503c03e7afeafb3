"""Held-out negative log-likelihood over non-overlapping windows.

A split's documents form one token stream (documents separated by the EOD token, as in
training). The stream is cut into non-overlapping windows of ``seq_len`` predicted tokens:
window i feeds tokens [i·L, (i+1)·L) and predicts tokens [i·L+1, (i+1)·L+1), so every token
after the first is predicted exactly once, with the same context length and batch shape as a
training step. A final shorter window takes the remainder. NLL is in nats per predicted token.

The blend's NLL is the final stage's blend weights applied to the per-source NLLs,
Σ_s w_s · NLL_s: the expected loss per token of a stream mixed as the final stage mixes its
training data, independent of how large each source's validation split happens to be.

Per document (``document_nll``): the target at stream position p belongs to document k = the
number of EOD tokens in positions [0, p), so a document's EOD counts as the document's last
target. Each document's summed NLL and predicted-token count are what a paired bootstrap over
documents resamples (``fp4repro.statistics.paired_bootstrap``): two runs score the same documents
with the same windows, so per-document sums pair exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fp4repro.eval.policy import batch_lengths


@dataclass(frozen=True)
class NLLResult:
    """Summed NLL (nats) over ``tokens`` predicted tokens."""

    total: float
    tokens: int

    @property
    def nll(self) -> float:
        return self.total / self.tokens if self.tokens else math.nan


@dataclass(frozen=True)
class DocumentNLL:
    """Per document of a stream: summed NLL (nats, float64) and predicted tokens (int64); only
    documents with at least one predicted token, ``document`` their index in the stream."""

    document: np.ndarray
    nll_sum: np.ndarray
    predicted: np.ndarray

    def total(self) -> NLLResult:
        return NLLResult(float(self.nll_sum.sum()), int(self.predicted.sum()))


def windows(
    stream: np.ndarray | torch.Tensor, seq_len: int, max_tokens: int | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, targets) of each non-overlapping window of a 1-D token stream (see the module
    docstring); ``max_tokens`` caps the predicted tokens (a prefix of the stream)."""
    tokens = torch.as_tensor(np.asarray(stream, dtype=np.int64))
    n_pred = len(tokens) - 1
    if max_tokens is not None:
        n_pred = min(n_pred, max_tokens)
    out = []
    for start in range(0, max(n_pred, 0), seq_len):
        end = min(start + seq_len, n_pred)
        out.append((tokens[start:end], tokens[start + 1 : end + 1]))
    return out


def logits_of(model: torch.nn.Module, inputs: torch.Tensor, lengths=None) -> torch.Tensor:
    """Float32 logits of a (batch, time) int64 tensor on the model's device, by the training
    loop's forward (``forward_logits``), without building a graph.

    lengths: the valid length of each row (padding after it); the quantized policy quantizes
    each row's real tokens as their own tensor (``fp4repro.eval.policy.batch_lengths``), so a
    row's logits do not depend on the other rows or on its padding. None: every row is full."""
    from fp4repro.train.engine import forward_logits

    with torch.no_grad(), batch_lengths(model, lengths):
        return forward_logits(model, inputs.to(next(model.parameters()).device))


def stream_nll(
    model: torch.nn.Module,
    stream: np.ndarray | torch.Tensor,
    seq_len: int,
    batch_size: int,
    max_tokens: int | None = None,
) -> NLLResult:
    """Summed cross-entropy of ``model`` over the windows of ``stream``, ``batch_size`` full
    windows per forward pass (the shorter last window on its own)."""
    return document_nll(model, stream, seq_len, batch_size, max_tokens).total()


def document_nll(
    model: torch.nn.Module,
    stream: np.ndarray | torch.Tensor,
    seq_len: int,
    batch_size: int,
    max_tokens: int | None = None,
    eod_id: int | None = None,
) -> DocumentNLL:
    """Per-token cross-entropy of ``model`` over the windows of ``stream`` (as ``stream_nll``),
    summed per document: documents end at each ``eod_id`` (None: the stream is one document)."""
    tokens = np.asarray(stream, dtype=np.int64)
    pieces = windows(tokens, seq_len, max_tokens)
    losses = []
    for batch in _batches(pieces, batch_size):
        inputs = torch.stack([w[0] for w in batch])
        targets = torch.stack([w[1] for w in batch])
        # every window of a batch is full length (a shorter last window runs alone): each is its
        # own sequence for the quantized policy, whatever windows it is batched with
        logits = logits_of(model, inputs, lengths=[inputs.shape[1]] * len(batch))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten().to(logits.device), reduction="none")
        losses.append(loss.double().cpu().numpy())
    per_token = np.concatenate(losses) if losses else np.zeros(0)
    # target j (0-based) is stream position j + 1; its document counts the EODs before it
    ends = tokens[: len(per_token)] == eod_id if eod_id is not None else np.zeros(len(per_token), dtype=bool)
    document = np.cumsum(ends)
    n = int(document[-1]) + 1 if len(document) else 0
    nll_sum = np.bincount(document, weights=per_token, minlength=n)
    predicted = np.bincount(document, minlength=n).astype(np.int64)
    kept = np.flatnonzero(predicted)
    return DocumentNLL(kept, nll_sum[kept], predicted[kept])


def _batches(pieces: list, batch_size: int):
    """Consecutive groups of at most ``batch_size`` windows of equal length."""
    group: list = []
    for piece in pieces:
        if group and (len(group) == batch_size or len(piece[0]) != len(group[0][0])):
            yield group
            group = []
        group.append(piece)
    if group:
        yield group


def blend_nll(per_source: dict[str, NLLResult], weights: dict[str, float]) -> NLLResult:
    """Σ_s w_s · NLL_s over the blend's sources (weights renormalised over those with weight > 0);
    ``tokens`` is the number of tokens evaluated across those sources."""
    used = {s: w for s, w in weights.items() if w > 0}
    norm = sum(used.values())
    nll = sum(w / norm * per_source[s].nll for s, w in used.items())
    tokens = sum(per_source[s].tokens for s in used)
    return NLLResult(nll * tokens, tokens)

"""Held-out NLL: windows, equality with the training loop's loss, the blend, the final-window loss."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fp4repro.config.model import load_model_config
from fp4repro.config.recipe import load_recipe
from fp4repro.eval import NLLResult, blend_nll, final_window_loss, load_eval_model, stream_nll, windows
from fp4repro.model import NemotronH
from fp4repro.train.engine import lm_loss


def test_windows_predict_every_token_once():
    stream = np.arange(23)
    pieces = windows(stream, 5)
    assert [len(x) for x, _ in pieces] == [5, 5, 5, 5, 2]
    targets = torch.cat([t for _, t in pieces])
    assert targets.tolist() == list(range(1, 23))
    for x, t in pieces:
        assert torch.equal(x + 1, t)  # next-token targets
    assert sum(len(t) for _, t in windows(stream, 5, max_tokens=12)) == 12


def test_bf16_policy_reproduces_the_training_loss(prepared, manifest, runs):
    """The training loop's loss on the same windows (batch rows of seq_len + 1 tokens, model built
    with the recipe, forward, mean cross-entropy) equals the NLL code under the bf16 policy."""
    from fp4repro.data import validation_tokens

    exp, _, _ = prepared
    L, B = exp.train.seq_len, exp.train.batch_size
    stream = validation_tokens(manifest, "code")[: 2 * B * L + 1]
    path = runs["bf16"] / "ckpt" / "step_00000012.pt"

    trained = NemotronH(load_model_config("tiny"), load_recipe("bf16"))
    trained.load_state_dict(torch.load(path, weights_only=False)["model"])
    batches = torch.as_tensor(stream[:-1]).view(2, B, L)
    following = torch.as_tensor(stream[1:]).view(2, B, L)
    losses = []
    with torch.no_grad():
        for inputs, targets in zip(batches, following):  # the training loop's loss itself
            losses.append(lm_loss(trained, inputs, targets).item())

    model, _ = load_eval_model(path, "bf16")
    result = stream_nll(model, stream, L, B)
    assert result.tokens == 2 * B * L
    assert result.nll == pytest.approx(sum(losses) / 2, rel=1e-6)


def test_nll_of_a_partial_last_window_is_a_direct_cross_entropy(manifest, runs):
    from fp4repro.data import validation_tokens

    stream = validation_tokens(manifest, "prose")[:150]
    model, _ = load_eval_model(runs["nvfp4"] / "ckpt" / "step_00000006.pt", "quantized")
    result = stream_nll(model, stream, 64, 8)
    tokens = torch.as_tensor(stream)
    with torch.no_grad():  # the two full windows form one batch, the remainder another
        full = F.cross_entropy(model(tokens[:128].view(2, 64)).flatten(0, 1), tokens[1:129], reduction="sum")
        rest = F.cross_entropy(model(tokens[128:149][None])[0], tokens[129:150], reduction="sum")
    total = full.item() + rest.item()
    assert result.tokens == 149
    assert result.total == pytest.approx(total, rel=1e-6)


def test_blend_weights_the_per_source_nll():
    per_source = {"prose": NLLResult(200.0, 100), "code": NLLResult(300.0, 50), "math": NLLResult(1.0, 1)}
    blend = blend_nll(per_source, {"prose": 0.4, "code": 0.6, "math": 0.0})
    assert blend.nll == pytest.approx(0.4 * 2.0 + 0.6 * 6.0)
    assert blend.tokens == 150


def test_final_window_loss_is_the_mean_over_the_last_tokens():
    df = pd.DataFrame(
        {"step": range(1, 11), "tokens": [100 * i for i in range(1, 11)], "loss": [float(i) for i in range(10, 0, -1)]}
    )
    out = final_window_loss(df, 0.2)
    assert (out["steps"], out["first_step"], out["last_step"]) == (2, 9, 10)
    assert out["loss"] == 1.5 and out["tokens_from"] == 800 and out["tokens_to"] == 1000
    assert out["loss_stderr"] == pytest.approx(0.5)
    assert math.isnan(final_window_loss(df, 0.1)["loss_stderr"])


def test_per_document_sums_split_the_stream_at_each_eod(manifest, runs):
    """Each target counts for the document it ends or lies in: a document's EOD is its last target."""
    from fp4repro.data import validation_tokens
    from fp4repro.eval import document_nll

    eod = manifest.eod_id
    stream = validation_tokens(manifest, "prose")[:150]
    ends = [p for p, t in enumerate(stream) if t == eod]
    assert len(ends) >= 2 and ends[-1] < 149, "the test needs a stream holding several documents"
    model, _ = load_eval_model(runs["nvfp4"] / "ckpt" / "step_00000006.pt", "quantized")
    docs = document_nll(model, stream, 64, 8, eod_id=eod)
    tokens = torch.as_tensor(stream)
    with torch.no_grad():  # per-target losses of the same windows and batches
        full = F.cross_entropy(model(tokens[:128].view(2, 64)).flatten(0, 1), tokens[1:129], reduction="none")
        rest = F.cross_entropy(model(tokens[128:149][None])[0], tokens[129:150], reduction="none")
    per_target = torch.cat([full, rest]).double()  # target j is stream position j + 1
    bounds = [0] + [e + 1 for e in ends if e + 1 <= 150]  # document k: positions (end_{k-1}, end_k]
    expected = []
    for k, start in enumerate(bounds):
        stop = bounds[k + 1] if k + 1 < len(bounds) else 150
        targets = [p - 1 for p in range(max(start, 1), stop)]
        if targets:
            expected.append((k, float(per_target[targets].sum()), len(targets)))
    assert docs.document.tolist() == [k for k, _, _ in expected]
    assert docs.predicted.tolist() == [n for _, _, n in expected]
    assert docs.nll_sum == pytest.approx([s for _, s, _ in expected], rel=1e-5)
    assert docs.total().tokens == 149


def test_without_an_eod_the_stream_is_one_document(manifest, runs):
    from fp4repro.data import validation_tokens
    from fp4repro.eval import document_nll

    stream = validation_tokens(manifest, "code")[:100]
    model, _ = load_eval_model(runs["bf16"] / "ckpt" / "step_00000006.pt", "bf16")
    docs = document_nll(model, stream, 32, 4)
    assert docs.document.tolist() == [0] and docs.predicted.tolist() == [99]
    assert docs.nll_sum[0] == pytest.approx(stream_nll(model, stream, 32, 4).total)

"""The lm-eval adapter against direct computations from the model's logits."""

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed (it is a dependency: `make setup` installs it)")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

from fp4repro.eval import load_eval_model
from fp4repro.eval.lm import FP4ReproLM


def _requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def _direct_logprob(model, context, continuation):
    """log p(continuation | context) from one forward pass over context + continuation[:-1]."""
    tokens = torch.tensor([context + continuation[:-1]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(tokens)[0].float(), dim=-1)
    positions = range(len(context) - 1, len(context) + len(continuation) - 1)
    picked = [logprobs[p, t] for p, t in zip(positions, continuation)]
    greedy = all(logprobs[p].argmax() == t for p, t in zip(positions, continuation))
    return float(sum(picked)), bool(greedy)


@pytest.fixture(scope="module")
def lm(runs, manifest):
    model, _ = load_eval_model(runs["ue5m3"] / "ckpt" / "step_00000012.pt", "bf16")
    tokenizer = manifest.load_tokenizer()
    return FP4ReproLM(model, tokenizer, manifest.eod_id, policy="bf16", max_length=64, batch_size=3)


PAIRS = [
    ("def main(argv):\n    ", "return 0"),
    ("Return the number of items", " in the list."),
    ("", "An empty context."),
    ("x = 1\n", "y = 2\n"),
    ("A", "B"),
]


def test_loglikelihood_equals_a_direct_computation(lm):
    results = lm.loglikelihood(_requests("loglikelihood", PAIRS))
    for (context, continuation), (logprob, greedy) in zip(PAIRS, results):
        ctx, cont = lm.encode_pair(context, continuation)
        expected, expected_greedy = _direct_logprob(lm.model, ctx, cont)
        assert logprob == pytest.approx(expected, abs=1e-4)
        assert greedy == expected_greedy
    assert lm.encode_pair("", "x")[0] == [lm.eod_id]  # empty context -> EOD
    assert lm.encode_pair("a:\n    ", "b")[1] == lm.tok_encode("a:\n    b")[len(lm.tok_encode("a:")) :]


def test_batches_hold_as_many_sequences_as_fit_in_batch_size_times_max_length_tokens(lm):
    assert lm.batch_size * lm.max_length == 192
    # longest first; each batch padded to its first sequence: 3 x 64 fit, a 4th does not
    assert lm.batches([64, 10, 64, 9, 40, 10]) == [[0, 2, 4], [1, 5, 3]]
    assert lm.batches([5] * 40) == [list(range(38)), [38, 39]]  # 38 x 5 <= 192 < 39 x 5
    assert lm.batches([0, 0]) == [[0, 1]]


def test_short_items_are_scored_in_one_forward_pass(lm, monkeypatch):
    import fp4repro.eval.lm as module

    widths = []

    def counted(model, inputs, lengths=None):
        widths.append(tuple(inputs.shape))
        return logits_of(model, inputs, lengths)

    logits_of = module.logits_of
    monkeypatch.setattr(module, "logits_of", counted)
    lm.loglikelihood(_requests("loglikelihood", PAIRS))
    assert len(widths) == 1 and widths[0][0] == len(PAIRS)


def test_long_contexts_keep_their_last_max_length_tokens(lm):
    context = "word " * 200
    ((logprob, _),) = lm.loglikelihood(_requests("loglikelihood", [(context, "end")]))
    ctx, cont = lm.encode_pair(context, "end")
    kept = (ctx + cont)[-(lm.max_length + 1) :]
    expected, _ = _direct_logprob(lm.model, kept[: -len(cont)], cont)
    assert logprob == pytest.approx(expected, abs=1e-4)


def test_loglikelihood_rolling_scores_every_token_once(lm):
    text = "The quick brown fox jumps over the lazy dog. " * 6
    (total,) = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(text,)]))
    tokens = lm.tok_encode(text)
    assert len(tokens) > lm.max_length  # several windows
    full = [lm.eod_id] + tokens
    expected = 0.0
    for start in range(0, len(tokens), lm.max_length):  # disjoint pieces, each with the fullest context
        piece = tokens[start : start + lm.max_length]
        context = full[max(0, start + len(piece) - lm.max_length) : start + 1]
        expected += _direct_logprob(lm.model, context, piece)[0]
    assert total == pytest.approx(expected, abs=1e-3)


def test_generate_until_is_greedy_and_stops(lm):
    context = "import os\n"
    (text,) = lm.generate_until(_requests("generate_until", [(context, {"until": ["\n\n"], "max_gen_toks": 6})]))
    tokens = lm.tok_encode(context)
    generated = []
    with torch.no_grad():
        for _ in range(6):
            nxt = int(lm.model(torch.tensor([tokens + generated]))[0, -1].argmax())
            if nxt == lm.eod_id:
                break
            generated.append(nxt)
    expected = lm.tok_decode(generated)
    assert text == expected.split("\n\n")[0]


def test_registered_with_lm_eval(runs, prepared):
    exp, _, results = prepared
    cls = get_model("fp4repro")
    assert cls is FP4ReproLM
    lm = cls.create_from_arg_string(
        f"checkpoint={runs['nvfp4'] / 'ckpt' / 'step_00000006.pt'},data={results / exp.name / 'data'},"
        "policy=quantized,max_length=64",
        {"batch_size": 2, "device": "cpu"},
    )
    assert (lm.policy, lm.max_length, lm.batch_size) == ("quantized", 64, 2)

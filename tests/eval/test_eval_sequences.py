"""Under the quantized policy an item's score does not depend on its batch.

Each sequence's activations are quantized as their own tensor over its real tokens, padding rows
as a group of their own (``CurrentAmaxState``, ``fp4repro.quant.linear.sequence_operand``). The
check: a model in which some token ids (a neighbour's, and the EOD padding) drive the first
linear's activations ~1000x above any other token's. An item batched with such a neighbour,
padded with such EOD rows, scores exactly as with a plain neighbour and plain padding; with the
grouping switched off (one amax over the whole batch, as before) it does not.

Equal batch widths: a different width changes the unquantized parts of the forward (SDPA
attention, the chunked SSD scan) at the float32 rounding level, in the bf16 policy as well.
"""

import copy

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed (it is a dependency: `make setup` installs it)")
from lm_eval.api.instance import Instance  # noqa: E402

from fp4repro.config.recipe import load_recipe
from fp4repro.eval import build_model, stream_nll
from fp4repro.eval.lm import FP4ReproLM
from fp4repro.quant.state import CurrentAmaxState

ITEM = ("def main(argv):\n    ", "return 0")
NEIGHBOUR = (
    "Return a new list containing all items from the iterable in ascending order. A custom key "
    "function can be supplied to customize the sort order, and the reverse flag can be set to "
    "request the result in descending order.",
    " The sort is guaranteed to be stable.",
)
CHANNEL, GAIN = 0, 1000.0


@pytest.fixture(params=["ue5m3", "nvfp4"])
def model(request):
    torch.manual_seed(0)
    return build_model("tiny", load_recipe(request.param), "quantized")


def crafted(model, huge_ids=()):
    """A copy of ``model`` whose layer-0 norm scales channel CHANNEL by GAIN and whose embeddings
    are 0 there, except for ``huge_ids``: those tokens' rows of the first linear's input (layer 0
    in_proj) then reach ~1000x the amax of any other token's; every other token computes as in
    ``crafted(model)``."""
    copied = copy.deepcopy(model)
    with torch.no_grad():
        emb = copied.embedding.weight
        emb[:, CHANNEL] = 0
        copied.layers[0].norm.weight[CHANNEL] = GAIN
        ids = torch.tensor(sorted(huge_ids), dtype=torch.long)
        if len(ids):
            emb[ids, CHANNEL] = 10 * emb[ids].abs().amax(1)
    return copied


def first_linear_amax(model, tokens: torch.Tensor) -> torch.Tensor:
    """Amax of each row of the first quantized linear's input for a (batch, time) token tensor."""
    seen = {}

    def record(module, args):  # a pre-hook that returns something replaces the input
        seen["amax"] = args[0].abs().amax(-1)

    handle = model.layers[0].mixer.in_proj.register_forward_pre_hook(record)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    return seen["amax"]


def grouping_off(monkeypatch):
    """One tensor per operand again: the whole batch shares each activation's amax."""
    monkeypatch.setattr(CurrentAmaxState, "sequence_lengths", lambda self, batch, width: None)


def _requests(pairs):
    return [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)]


@pytest.mark.parametrize("grouped", [True, False])
def test_an_items_score_ignores_its_neighbour_and_padding(model, manifest, monkeypatch, grouped):
    tokenizer = manifest.load_tokenizer()
    lm = FP4ReproLM(model, tokenizer, manifest.eod_id, policy="quantized", max_length=64, batch_size=2)
    item = sum(lm.encode_pair(*ITEM), [])
    neighbour = sum(lm.encode_pair(*NEIGHBOUR), [])
    assert manifest.eod_id not in item and len(neighbour) > len(item) + 8  # the item gets padded
    plain = crafted(model)
    # the neighbour's own tokens and the EOD padding: huge activations
    loud = crafted(model, (set(neighbour) - set(item)) | {manifest.eod_id})
    width = min(len(neighbour), lm.max_length + 1) - 1
    batch = torch.full((2, width), manifest.eod_id)
    batch[0, : len(item) - 1] = torch.tensor(item[:-1])
    batch[1] = torch.tensor(neighbour[-width - 1 : -1])
    amax = first_linear_amax(loud, batch)
    assert amax[1].max() > 1000 * amax[0, : len(item) - 1].max()  # the neighbour
    assert amax[0, len(item) - 1 :].min() > 1000 * amax[0, : len(item) - 1].max()  # the padding
    if not grouped:
        grouping_off(monkeypatch)

    def scores(m):
        return FP4ReproLM(m, tokenizer, manifest.eod_id, policy="quantized", max_length=64, batch_size=2).loglikelihood(
            _requests([ITEM, NEIGHBOUR])
        )

    (item_plain, _), (neighbour_plain, _) = scores(plain)
    (item_loud, greedy_loud), (neighbour_loud, _) = scores(loud)
    assert neighbour_loud != neighbour_plain  # the neighbour did change
    if grouped:
        assert item_loud == item_plain  # bit for bit
        # alone (no padding, a narrower batch): equal up to the float32 rounding of attention
        # and the SSD scan at another width (see the module docstring)
        ((alone, greedy_alone),) = FP4ReproLM(
            loud, tokenizer, manifest.eod_id, policy="quantized", max_length=64, batch_size=2
        ).loglikelihood(_requests([ITEM]))
        assert alone == pytest.approx(item_loud, abs=1e-4) and greedy_alone == greedy_loud
    else:
        assert abs(item_loud - item_plain) > 1e-3  # what the grouping prevents


@pytest.mark.parametrize("grouped", [True, False])
def test_a_windows_logits_ignore_the_windows_batched_with_it(model, monkeypatch, grouped):
    """stream_nll batches full windows: a window's logits are those it gets alone."""
    L = 32
    gen = torch.Generator().manual_seed(3)
    item = torch.randint(0, 1000, (L + 1,), generator=gen)
    neighbours = torch.randint(1000, 2000, (2 * L + 1,), generator=gen)
    loud = crafted(model, set(neighbours.tolist()))
    if not grouped:
        grouping_off(monkeypatch)
    captured = []
    handle = loud.register_forward_hook(lambda module, args, out: captured.append(out[0].clone()))
    try:
        alone = stream_nll(loud, item, L, batch_size=4)  # one window, batch of one
        batched = stream_nll(loud, torch.cat([item[:L], neighbours]), L, batch_size=4)  # three windows
    finally:
        handle.remove()
    assert alone.tokens == L and batched.tokens == 3 * L
    amax = first_linear_amax(loud, torch.stack([item[:L], neighbours[:L]]))
    assert amax[1].min() > 1000 * amax[0].max()
    if grouped:
        assert torch.equal(captured[0], captured[1])  # bit for bit
    else:
        assert (captured[0] - captured[1]).abs().max() > 1e-3

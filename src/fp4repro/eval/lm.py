"""lm-eval adapter: the reference model, its tokenizer and an inference policy as an ``LM``.

Registered with lm-eval as ``fp4repro`` when this module is imported, so both of these work::

    lm_eval.simple_evaluate(model=FP4ReproLM.from_checkpoint(path, data="results/tiny/data",
                                                             policy="quantized"), tasks=[...])
    lm_eval.simple_evaluate(model="fp4repro",
                            model_args="checkpoint=PATH,data=results/tiny/data,policy=quantized", tasks=[...])

Scoring follows lm-eval's Hugging Face adapter: a context's trailing whitespace moves to the
continuation, the continuation's tokens are those of (context + continuation) after the
context's tokens, an empty context is replaced by the EOD token, and inputs longer than
``max_length`` keep their last ``max_length`` tokens. Requests are scored longest first, in
batches of as many sequences as fit in ``batch_size`` × ``max_length`` tokens, padding included
(the tokens of a batch of full windows: many short multiple-choice items go to one forward
pass, not ``batch_size``), right-padded with EOD (causal: padding never changes the
scored positions). Under the quantized policy each sequence's activations are quantized as
their own tensor, over its real tokens (the scorer passes the lengths: ``logits_of``), so an
item's score does not depend on the items it is batched with nor on its padding.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tokenizers import Tokenizer
from tqdm import tqdm

from fp4repro.eval.errors import EvalError
from fp4repro.eval.nll import logits_of
from fp4repro.eval.policy import check_policy, load_eval_model


@register_model("fp4repro")
class FP4ReproLM(LM):
    """An fp4repro NemotronH as an lm-eval language model.

    model:        a NemotronH in eval mode (built for the policy, see ``fp4repro.eval.policy``)
    tokenizer:    the ``tokenizers`` byte-level BPE the model was trained with
    eod_id:       the end-of-document token: prefix of empty contexts, padding, generation stop
    policy:       'bf16' or 'quantized' (recorded; the model must already be built for it)
    max_length:   context window in tokens (the training sequence length)
    batch_size:   full-length sequences per forward pass: a pass holds at most
                  batch_size × max_length tokens (padding included), shorter sequences more of them
    max_gen_toks: default generation budget of generate_until
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        eod_id: int,
        policy: str = "bf16",
        max_length: int = 2048,
        batch_size: int = 16,
        max_gen_toks: int = 128,
        progress: bool = False,
    ):
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.tokenizer.encode_special_tokens = True  # "<|endoftext|>" inside a text is text, as in training
        self.eod_id = int(eod_id)
        self.policy = check_policy(policy)
        self._max_length = int(max_length)
        self.batch_size = int(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.progress = progress
        self._device = next(model.parameters()).device

    # ------------------------------------------------------------------------- construction
    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str | Path,
        data: str | Path | None = None,
        tokenizer: str | None = None,
        eod_id: int | None = None,
        policy: str = "bf16",
        max_length: int | None = None,
        batch_size: int | str | None = 16,
        device: str | None = None,
        max_gen_toks: int = 128,
        progress: bool = False,
    ) -> FP4ReproLM:
        """Load an evaluation checkpoint under ``policy``. The tokenizer and EOD id come from a
        prepared data folder (``data``: its manifest) or from ``tokenizer`` (a tokenizer.json)
        and ``eod_id``; ``max_length`` defaults to the checkpoint's experiment's train.seq_len."""
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, ckpt = load_eval_model(Path(checkpoint), policy, device=device)
        if data is not None:
            from fp4repro.data import load_manifest

            manifest = load_manifest(Path(data))
            tokenizer, eod_id = tokenizer or manifest.tokenizer_path, manifest.eod_id if eod_id is None else eod_id
        if tokenizer is None or eod_id is None:
            raise EvalError(
                "fp4repro LM: give data=<prepared data folder> or tokenizer=<tokenizer.json> and eod_id=<id>"
            )
        if max_length is None:
            max_length = _experiment_seq_len(ckpt, checkpoint)
        size = 16 if batch_size in (None, "auto") or str(batch_size).startswith("auto") else int(batch_size)
        from fp4repro.data.tokenizer import load_tokenizer

        return cls(
            model,
            load_tokenizer(tokenizer),
            int(eod_id),
            policy=policy,
            max_length=int(max_length),
            batch_size=size,
            max_gen_toks=int(max_gen_toks),
            progress=progress,
        )

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> FP4ReproLM:
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in ("batch_size", "device")}
        return cls.from_checkpoint(**{**arg_dict, **extra})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> FP4ReproLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ------------------------------------------------------------------------------ tokens
    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def eot_token_id(self) -> int:
        return self.eod_id

    @property
    def prefix_token_id(self) -> int:
        return self.eod_id

    def tok_encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context tokens, continuation tokens) as lm-eval's Hugging Face adapter forms them."""
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        if context == "":
            return [self.eod_id], self.tok_encode(continuation)
        whole = self.tok_encode(context + continuation)
        context_tokens = self.tok_encode(context)
        return context_tokens, whole[len(context_tokens) :]

    # ----------------------------------------------------------------------------- scoring
    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log-probabilities of the continuation, whether greedy decoding produces it)
        for each (context tokens, continuation tokens) pair."""
        for i, (_, continuation) in enumerate(pairs):
            if not 0 < len(continuation) <= self.max_length:
                raise EvalError(
                    f"request {i}: continuation of {len(continuation)} tokens; "
                    f"must be 1..{self.max_length} (max_length)"
                )
        # what the model reads: the last max_length + 1 tokens, the last of them only predicted
        inputs = [(context + continuation)[-(self.max_length + 1) :][:-1] for context, continuation in pairs]
        results: list[tuple[float, bool] | None] = [None] * len(pairs)
        batches = self.batches([len(x) for x in inputs])
        for batch in tqdm(batches, disable=not self.progress, desc=f"fp4repro {self.policy}", leave=False):
            scored = self._score_batch([inputs[i] for i in batch], [pairs[i][1] for i in batch])
            for i, result in zip(batch, scored):
                results[i] = result
        return results

    def batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices of ``lengths`` grouped into forward passes, longest first: each batch is padded
        to its first (longest) sequence and holds at most batch_size × max_length tokens."""
        budget = self.batch_size * self.max_length
        batches: list[list[int]] = []
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            if not batches or (len(batches[-1]) + 1) * lengths[batches[-1][0]] > budget:
                batches.append([])
            batches[-1].append(i)
        return batches

    def _score_batch(self, inputs: list[list[int]], continuations: list[list[int]]) -> list[tuple[float, bool]]:
        width = max(len(x) for x in inputs)
        padded = torch.full((len(inputs), width), self.eod_id, dtype=torch.long)
        for row, x in enumerate(inputs):
            padded[row, : len(x)] = torch.tensor(x, dtype=torch.long)
        logits = logits_of(self.model, padded, lengths=[len(x) for x in inputs])
        totals, greedy = [], []
        for row, (x, continuation) in enumerate(zip(inputs, continuations)):
            # only the continuation's positions, on the model's device: a (batch, time, vocab)
            # log-softmax copied to the host would be tens of GB for a long-context 8B eval
            lp = F.log_softmax(logits[row, len(x) - len(continuation) : len(x)], dim=-1)
            target = torch.tensor(continuation, dtype=torch.long, device=lp.device)
            totals.append(lp.gather(1, target[:, None]).sum())
            greedy.append((lp.argmax(-1) == target).all())
        return list(zip(torch.stack(totals).tolist(), torch.stack(greedy).tolist()))

    # ------------------------------------------------------------------------ lm-eval API
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        results = self.score([self.encode_pair(*r.args) for r in requests])
        for r, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", r.args, result)
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Log-likelihood of each whole string, in disjoint windows of at most max_length
        predicted tokens (each window with the fullest context that fits), after an EOD prefix."""
        out = []
        for r in requests:
            (text,) = r.args
            pieces = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.eod_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            total = sum(lp for lp, _ in self.score(pieces)) if pieces else 0.0
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests) -> list[str]:
        """Greedy decoding until one of the ``until`` strings, EOD or ``max_gen_toks`` tokens;
        the result is cut before the first stop string."""
        out = []
        for r in tqdm(requests, disable=not self.progress, desc=f"fp4repro generate {self.policy}", leave=False):
            context, kwargs = r.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            text = self.greedy(context, until, int(kwargs.get("max_gen_toks", self.max_gen_toks)))
            self.cache_hook.add_partial("generate_until", r.args, text)
            out.append(text)
        return out

    def greedy(self, context: str, until: list[str], max_new_tokens: int) -> str:
        tokens = self.tok_encode(context) or [self.eod_id]
        generated: list[int] = []
        text = ""
        for _ in range(max_new_tokens):
            window = torch.tensor([(tokens + generated)[-self.max_length :]], dtype=torch.long)
            next_token = int(logits_of(self.model, window, lengths=[window.shape[1]])[0, -1].argmax())
            if next_token == self.eod_id:
                break
            generated.append(next_token)
            text = self.tok_decode(generated)
            if any(stop in text for stop in until):
                break
        cuts = [text.index(stop) for stop in until if stop in text]
        return text[: min(cuts)] if cuts else text

    def get_model_info(self) -> dict:
        return {
            "policy": self.policy,
            "max_length": self.max_length,
            "tokens_per_forward": self.batch_size * self.max_length,
        }


def _experiment_seq_len(ckpt: dict, checkpoint) -> int:
    from fp4repro.config.experiment import load_experiment
    from fp4repro.errors import ConfigError

    try:
        return load_experiment(ckpt.get("experiment", "")).train.seq_len
    except ConfigError:
        raise EvalError(
            f"{checkpoint}: its experiment {ckpt.get('experiment')!r} is not a known experiment; "
            "give max_length=<context window in tokens>"
        ) from None

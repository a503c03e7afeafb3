"""Tokenizer: a byte-level BPE trained with Hugging Face ``tokenizers``, or a given tokenizer.json.

Byte-level means every byte string has an encoding (no unknown token), which matters for code.
The one special token, ``<|endoftext|>``, separates documents (EOD). Training is deterministic:
the same documents and vocabulary size give a byte-identical ``tokenizer.json``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from fp4repro.data.errors import DataError

EOD_TOKEN = "<|endoftext|>"
# End-of-document tokens of common tokenizers, tried in this order in a given tokenizer.json.
KNOWN_EOD_TOKENS = (EOD_TOKEN, "<|end_of_text|>", "</s>", "<eos>")


def train_bpe(texts: Iterable[str], vocab_size: int, progress: bool = False) -> Tokenizer:
    """Train a byte-level BPE of ``vocab_size`` entries (256 bytes, EOD, merges) on ``texts``.

    A corpus too small for that many merges gives a smaller vocabulary; ids stay below
    ``vocab_size`` either way.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json, with a clear error when it is missing or not one."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"tokenizer: {path}: no such file")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a bare Exception
        raise DataError(f"tokenizer: {path}: not a Hugging Face tokenizer.json ({err})") from None


def eod_id(tokenizer: Tokenizer, path: str | Path) -> int:
    """The id of the tokenizer's end-of-document token (``<|endoftext|>`` or a common alias)."""
    for token in KNOWN_EOD_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise DataError(f"tokenizer: {path}: has none of the end-of-document tokens {list(KNOWN_EOD_TOKENS)}")


def encode_documents(tokenizer: Tokenizer, texts: list[str], eod: int, dtype: np.dtype) -> list[np.ndarray]:
    """Token ids of each text followed by EOD. Special-token strings inside the text (a document
    that mentions ``<|endoftext|>``) are encoded as plain text, so EOD only ever separates documents."""
    tokenizer.encode_special_tokens = True
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return [np.array([*e.ids, eod], dtype=dtype) for e in encodings]


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class MegatronTokenizer:
    """What megatron-core's GPT datasets need of a tokenizer: ``vocab_size``, ``eod`` and
    ``unique_identifiers`` (part of the hash that names their index caches), plus text round trips."""

    def __init__(self, path: str | Path, vocab_size: int, eod: int):
        self.path = str(path)
        self.vocab_size = vocab_size
        self.eod = eod
        self.unique_identifiers = {
            "class": type(self).__name__,
            "sha256": file_sha256(path),
            "vocab_size": vocab_size,
            "eod": eod,
        }
        self._tokenizer: Tokenizer | None = None

    def _hf(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

    def tokenize(self, text: str) -> list[int]:
        return self._hf().encode(text, add_special_tokens=False).ids

    def detokenize(self, ids) -> str:
        return self._hf().decode(list(ids), skip_special_tokens=False)

"""Byte-level tokenizer of the reference model: token id == byte value, plus special tokens.

The training and evaluation code tokenises with :func:`encode` (a direct byte view, fast
and dependency-free); :func:`build_tokenizer` produces the equivalent ``tokenizers``
object that is shipped as ``tokenizer.json`` for other tools.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, UNK_TOKEN)
BYTE_VOCAB = 256
BOS_ID, EOS_ID, PAD_ID, UNK_ID = range(BYTE_VOCAB, BYTE_VOCAB + len(SPECIAL_TOKENS))
VOCAB_SIZE = BYTE_VOCAB + len(SPECIAL_TOKENS)


def encode(data: str | bytes) -> np.ndarray:
    """Token ids of ``data`` (UTF-8 bytes for a ``str``) as a ``uint16`` array."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return np.frombuffer(raw, dtype=np.uint8).astype(np.uint16)


def decode(ids) -> str:
    """Text of a sequence of ids; special tokens are dropped, invalid UTF-8 is replaced."""
    raw = bytes(int(i) for i in ids if 0 <= int(i) < BYTE_VOCAB)
    return raw.decode("utf-8", errors="replace")


def build_tokenizer() -> Tokenizer:
    """Byte-level ``tokenizers.Tokenizer`` whose ids match :func:`encode`.

    Returns
    -------
    tokenizers.Tokenizer
        A BPE model with no merges over the 256 GPT-2 byte symbols (symbol of byte ``b``
        has id ``b``), followed by :data:`SPECIAL_TOKENS`.
    """
    byte_to_symbol = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel.alphabet() is unordered; rebuild the GPT-2 byte -> symbol map explicitly.
    symbols = _gpt2_byte_symbols()
    assert set(symbols) == set(byte_to_symbol)
    vocab = {sym: b for b, sym in enumerate(symbols)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _gpt2_byte_symbols() -> list[str]:
    """GPT-2's reversible byte -> printable unicode symbol table, indexed by byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]

"""Real text for real checkpoints: the bundled sentence and passage pairs, tokenized with the checkpoint's tokenizer.

``parity/inputs/data/sentences.txt`` holds pairs of short paraphrased sentences (12-20 tokens) and
``parity/inputs/data/passages.txt`` pairs of paraphrased passages (115-145 tokens, for fine-tuning at
T = 128), both written for this project (public domain) and grouped by topic in runs of eight pairs,
so that the other pairs of a batch are hard negatives for the contrastive loss.
Tokenization uses the checkpoint's own ``tokenizer.json`` through the ``tokenizers`` library,
offline. Batches have a fixed shape (padded with the pad id, truncated at ``seq_len`` as
sentence-transformers truncates at ``max_seq_length``), so each jitted program compiles once.
"""

from __future__ import annotations

# Deferred imports: tokenizers (the optional minilm/dev extra) loads only when real text is tokenized.

import functools
from importlib import resources
from pathlib import Path

import numpy as np

from parity.inputs.corpus import corpus_text

SENTENCES_FILE = "data/sentences.txt"
PASSAGES_FILE = "data/passages.txt"


@functools.lru_cache(maxsize=None)
def _read_pairs(name: str) -> tuple[tuple[str, str], ...]:
    """The pairs of the bundled file ``parity/inputs/<name>``: one pair a line, two tab-separated texts."""
    text = resources.files("parity.inputs").joinpath(name).read_text(encoding="utf-8")
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ValueError(f"parity/inputs/{name} line {n}: expected two non-empty tab-separated texts")
        pairs.append((parts[0].strip(), parts[1].strip()))
    return tuple(pairs)


def sentence_pairs() -> list[tuple[str, str]]:
    """The bundled sentence pairs ``(anchor, positive)``, in file order (comment lines skipped)."""
    return list(_read_pairs(SENTENCES_FILE))


def passage_pairs() -> list[tuple[str, str]]:
    """The bundled passage pairs ``(anchor, positive)``, in file order (comment lines skipped).

    48 pairs in six topic groups of eight; each text is 100-125 words (115-145 WordPiece tokens
    with the all-MiniLM-L6-v2 tokenizer; ``parity/inputs/data/SOURCES.md`` gives the distribution).
    """
    return list(_read_pairs(PASSAGES_FILE))


def load_tokenizer(checkpoint_dir):
    """The ``tokenizers.Tokenizer`` of ``checkpoint_dir/tokenizer.json`` (no network).

    Raises:
        ValueError: the file is missing, or the ``tokenizers`` package is not installed (the
            message gives the install command).
    """
    path = Path(checkpoint_dir) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: the checkpoint directory needs a tokenizer.json (a `tokenizers` file)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("the `tokenizers` package is missing: pip install -e '.[minilm]'") from None
    return Tokenizer.from_file(str(path))


def _encode(tokenizer, texts: list[str], length: int, pad_id: int) -> np.ndarray:
    tokenizer.enable_truncation(max_length=length)
    tokenizer.enable_padding(pad_id=pad_id, length=length)
    return np.array([e.ids for e in tokenizer.encode_batch(texts)], dtype=np.int64)


def _pair_batch(pairs: list[tuple[str, str]], tokenizer, n_pairs: int, seq_len: int, pad_id: int,
                seed: int) -> np.ndarray:
    """``(2 * n_pairs, seq_len)`` int64 ids of ``n_pairs`` consecutive pairs from ``seed * n_pairs`` (cyclic)."""
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or not 2 <= n_pairs <= len(pairs):
        raise ValueError(f"n_pairs must be an integer in [2, {len(pairs)}], got {n_pairs!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 4:
        raise ValueError(f"seq_len must be an integer >= 4, got {seq_len!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    start = (int(seed) * n_pairs) % len(pairs)
    chosen = [pairs[(start + i) % len(pairs)] for i in range(n_pairs)]
    ids = _encode(tokenizer, [s for pair in chosen for s in pair], seq_len, pad_id)
    if ((ids != pad_id).sum(axis=1) < 3).any():
        raise ValueError("a text tokenized to fewer than 3 tokens; check the tokenizer and pad id")
    return ids


def sentence_batch(tokenizer, n_pairs: int, seq_len: int, *, pad_id: int = 0, seed: int = 0) -> np.ndarray:
    """A contrastive batch of the bundled sentence pairs: rows ``2i`` and ``2i+1`` are the two sentences of pair i.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (e.g. from :func:`load_tokenizer`).
        n_pairs: pairs per batch (>= 2, at most the number of bundled pairs).
        seq_len: tokens per row T, including special tokens; longer sentences are truncated.
        pad_id: id written after the end of each sentence (the checkpoint's pad token).
        seed: which pairs: ``n_pairs`` consecutive pairs starting at ``seed * n_pairs`` (cyclic),
            so seed 0 takes the first topic group of the file.

    Returns:
        int64 array of shape (2 * n_pairs, seq_len).

    Raises:
        ValueError: ``n_pairs``, ``seq_len`` or ``seed`` out of range, or a sentence that does not fit
            (only padding or a lone special token would remain).
    """
    return _pair_batch(sentence_pairs(), tokenizer, n_pairs, seq_len, pad_id, seed)


def passage_batch(tokenizer, n_pairs: int, seq_len: int, *, pad_id: int = 0, seed: int = 0) -> np.ndarray:
    """A contrastive batch of the bundled passage pairs (:func:`passage_pairs`), for fine-tuning at T ~ 128.

    Rows ``2i`` and ``2i+1`` are the two passages of pair i, each truncated at ``seq_len`` tokens
    (special tokens included) and padded with ``pad_id`` up to it. The pairs are the ``n_pairs``
    consecutive pairs from ``seed * n_pairs`` (cyclic), as in :func:`sentence_batch`: with
    ``n_pairs=8`` the batch is topic group ``seed mod 6``, so a fine-tuning run whose step ``s``
    takes ``seed0 + s`` has a fixed data order that cycles through the six topics.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (e.g. from :func:`load_tokenizer`).
        n_pairs: pairs per batch (>= 2, at most 48).
        seq_len: tokens per row T, including special tokens. At T = 128 every text fills at least
            114 positions (``parity/inputs/data/SOURCES.md``).
        pad_id: the checkpoint's pad token id.
        seed: the batch index (see above).

    Returns:
        int64 array of shape (2 * n_pairs, seq_len).

    Raises:
        ValueError: ``n_pairs``, ``seq_len`` or ``seed`` out of range.
    """
    return _pair_batch(passage_pairs(), tokenizer, n_pairs, seq_len, pad_id, seed)


def text_windows(tokenizer, batch_size: int, seq_len: int, *, seed: int = 0) -> np.ndarray:
    """Next-token windows of the bundled corpus tokenized with ``tokenizer`` (for GPT-2 checkpoints).

    Returns:
        int64 array of shape (batch_size, seq_len + 1).

    Raises:
        ValueError: a size < 1, or the tokenized corpus is shorter than ``seq_len + 1``.
    """
    tokenizer.no_truncation()
    tokenizer.no_padding()
    ids = np.array(tokenizer.encode(corpus_text()).ids, dtype=np.int64)
    if batch_size < 1 or seq_len < 1 or len(ids) < seq_len + 1:
        raise ValueError(f"need batch_size, seq_len >= 1 and a corpus of >= seq_len + 1 tokens; got "
                         f"{batch_size}, {seq_len}, {len(ids)} tokens")
    starts = np.random.default_rng(seed).integers(0, len(ids) - seq_len, size=batch_size)
    return np.stack([ids[s:s + seq_len + 1] for s in starts])

"""Real text for real checkpoints: the bundled sentence pairs, tokenized with the checkpoint's tokenizer.

``parity/inputs/data/sentences.txt`` holds pairs of paraphrases written for this project (public domain),
grouped by topic so that the other pairs of a batch are hard negatives for the contrastive loss.
Tokenization uses the checkpoint's own ``tokenizer.json`` through the ``tokenizers`` library,
offline. Batches have a fixed shape (padded with the pad id, truncated at ``seq_len``), so each
jitted program compiles once.
"""

from __future__ import annotations

# Deferred imports: tokenizers (the optional minilm/dev extra) loads only when real text is tokenized.

from importlib import resources
from pathlib import Path

import numpy as np

from parity.inputs.corpus import corpus_text


def sentence_pairs() -> list[tuple[str, str]]:
    """The bundled pairs ``(anchor, positive)``, in file order (comment lines skipped)."""
    text = resources.files("parity.inputs").joinpath("data/sentences.txt").read_text(encoding="utf-8")
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise ValueError(f"parity/inputs/data/sentences.txt line {n}: expected two tab-separated sentences")
        pairs.append((parts[0].strip(), parts[1].strip()))
    return pairs


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


def sentence_batch(tokenizer, n_pairs: int, seq_len: int, *, pad_id: int = 0, seed: int = 0) -> np.ndarray:
    """A contrastive batch: rows ``2i`` and ``2i+1`` are the two sentences of pair i.

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
        ValueError: ``n_pairs`` or ``seq_len`` out of range, or a sentence that does not fit
            (only padding or a lone special token would remain).
    """
    pairs = sentence_pairs()
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or not 2 <= n_pairs <= len(pairs):
        raise ValueError(f"n_pairs must be an integer in [2, {len(pairs)}], got {n_pairs!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 4:
        raise ValueError(f"seq_len must be an integer >= 4, got {seq_len!r}")
    start = (seed * n_pairs) % len(pairs)
    chosen = [pairs[(start + i) % len(pairs)] for i in range(n_pairs)]
    ids = _encode(tokenizer, [s for pair in chosen for s in pair], seq_len, pad_id)
    if ((ids != pad_id).sum(axis=1) < 3).any():
        raise ValueError("a sentence tokenized to fewer than 3 tokens; check the tokenizer and pad id")
    return ids


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

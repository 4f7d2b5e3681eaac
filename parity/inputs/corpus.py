"""Real tokens for the parity suite: a public-domain English text, tokenized at byte level.

The corpus ships with the package (``parity/inputs/data/corpus.txt``, see ``SOURCES.md`` beside it);
nothing is downloaded. Byte-level tokenization maps each UTF-8 byte to its id in ``[0, 256)``,
so the vocabulary is 256 and the mapping is exact and reversible.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

BYTE_VOCAB_SIZE = 256


def corpus_text() -> str:
    """The bundled public-domain corpus (about 3.7 KB of English prose)."""
    return resources.files("parity.inputs").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def byte_tokens(text: str) -> np.ndarray:
    """UTF-8 bytes of ``text`` as token ids: int64 array of shape (len(bytes),), values in [0, 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def detokenize(ids: np.ndarray) -> str:
    """Inverse of :func:`byte_tokens` (invalid UTF-8 sequences are replaced)."""
    return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


def token_batch(batch_size: int, seq_len: int, *, seed: int = 0, text: str | None = None) -> np.ndarray:
    """A batch of real-text windows for next-token training.

    Args:
        batch_size: number of windows B (>= 1).
        seq_len: model input length T (>= 1); each window holds T + 1 tokens (inputs + shifted targets).
        seed: seed choosing the window offsets (``numpy.random.default_rng``).
        text: text to tokenize; the bundled corpus by default.

    Returns:
        int64 array of shape (B, T + 1) with byte ids in [0, 256).

    Raises:
        ValueError: a size is < 1, or the text is shorter than T + 1 bytes.
    """
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    ids = byte_tokens(corpus_text() if text is None else text)
    if len(ids) < seq_len + 1:
        raise ValueError(f"text has {len(ids)} bytes; need at least seq_len + 1 = {seq_len + 1}")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(ids) - seq_len, size=batch_size)
    return np.stack([ids[s : s + seq_len + 1] for s in starts])

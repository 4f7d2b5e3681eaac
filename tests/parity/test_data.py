import numpy as np
import pytest

from parity.inputs.corpus import byte_tokens, corpus_text, detokenize, token_batch


def test_corpus_is_real_text_of_a_few_kb():
    text = corpus_text()
    assert 2000 < len(text.encode()) < 20000
    assert "Four score and seven years ago" in text


def test_token_batch_windows_are_corpus_slices():
    b = token_batch(3, 16, seed=1)
    assert b.shape == (3, 17) and b.dtype == np.int64
    assert b.min() >= 0 and b.max() < 256
    ids = byte_tokens(corpus_text())
    for row in b:
        text = detokenize(row)
        assert text in corpus_text() or np.any([np.array_equal(ids[i:i + 17], row) for i in range(len(ids) - 16)])
    assert np.array_equal(b, token_batch(3, 16, seed=1))


def test_token_batch_rejects_bad_sizes():
    with pytest.raises(ValueError, match="seq_len"):
        token_batch(1, 0)
    with pytest.raises(ValueError, match="bytes"):
        token_batch(1, 10, text="short")

"""The bundled pair files and the contrastive batches cut from them (a word-level tokenizer, no download)."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="tokenizers is a dev/minilm extra: pip install -e '.[dev]'")

from parity.inputs.presets import get_preset  # noqa: E402
from parity.inputs.sentences import load_tokenizer, passage_batch, passage_pairs, sentence_batch, sentence_pairs  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, word_tokenizer):
    path = tmp_path_factory.mktemp("tok")
    word_tokenizer(path)
    return load_tokenizer(path)


def test_passage_pairs_are_six_topics_of_eight_long_paraphrases():
    pairs = passage_pairs()
    assert len(pairs) == 48 and len(set(pairs)) == 48 and len(sentence_pairs()) == 16
    words = [len(t.split()) for pair in pairs for t in pair]
    assert min(words) >= 100 and max(words) <= 125, (min(words), max(words))
    assert all(a != b and t.isascii() for a, b in pairs for t in (a, b))


def test_passage_batch_is_consecutive_pairs_padded_to_t(tokenizer):
    ids = passage_batch(tokenizer, 4, 128, seed=1)
    assert ids.shape == (8, 128) and ids.dtype == np.int64
    assert (ids[:, 0] == 2).all() and (ids != 0).sum(axis=1).min() >= 100  # [CLS] first, the passages fill T
    assert np.array_equal(ids, passage_batch(tokenizer, 4, 128, seed=13))  # 48 pairs: batch 13 is batch 1 again
    assert not np.array_equal(ids, passage_batch(tokenizer, 4, 128, seed=2))
    assert sentence_batch(tokenizer, 4, 16).shape == (8, 16)
    with pytest.raises(ValueError, match="n_pairs"):
        passage_batch(tokenizer, 49, 128)
    with pytest.raises(ValueError, match="seed"):
        passage_batch(tokenizer, 4, 128, seed=1.5)


def test_minilm_presets_take_passages_at_t128_and_sentences_at_t16():
    long, short = get_preset("minilm-l6"), get_preset("minilm-l6-short")
    assert (long.batch_size, long.seq_len, long.texts) == (8, 128, "passages")
    assert (short.batch_size, short.seq_len, short.texts) == (8, 16, "sentences")
    assert "full" in long.schedules and "full" not in short.schedules
    with pytest.raises(ValueError, match="texts must be 'sentences' or 'passages'"):
        dataclasses.replace(long, texts="essays")

"""Shared helpers of the parity tests: a plan run through the harness's one door into a framework."""

import pytest

from jaxremat.spec.plan import parse_plan
from parity.inputs.sentences import sentence_pairs
from parity.inputs.train import AdamWConfig
from parity.runners.framework import FRAMEWORKS, RunOptions, get_framework


def run_plan(framework: str, cfg, params, tokens, plan, *, mode: str | None = None, hparams=AdamWConfig(),
             **options):
    """``get_framework(framework).run_plan`` with ``plan`` parsed and the options given as keywords
    (mode: the framework's measured one unless given)."""
    mode = mode or FRAMEWORKS[framework].measured_mode
    return get_framework(framework).run_plan(mode, cfg, params, tokens, parse_plan(plan),
                                             RunOptions(hparams=hparams, **options))


@pytest.fixture(scope="session")
def run_framework():
    """:func:`run_plan` as a fixture."""
    return run_plan


def word_tokenizer_file(path):
    """A word-level BERT-style tokenizer over the bundled sentences, saved as path/tokenizer.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    words = sorted({w for pair in sentence_pairs() for s in pair for w in pre_tokenizers.Whitespace()
                    .pre_tokenize_str(s.lower()) for w in [w[0]]})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(path / "tokenizer.json"))
    return len(vocab)


@pytest.fixture(scope="session")
def word_tokenizer():
    """:func:`word_tokenizer_file` as a fixture: ``word_tokenizer(dir) -> vocabulary size``."""
    return word_tokenizer_file

"""Built-in model presets of the parity suite (names accepted by ``--model``)."""

from __future__ import annotations


from jaxremat.models import TransformerConfig

from parity.inputs.corpus import BYTE_VOCAB_SIZE
from parity.inputs.model_preset import ModelPreset
from parity.inputs.pretrained import FINE_TUNE, MINILM_INSTALL, minilm_dir

_MINILM = TransformerConfig(arch="bert", vocab_size=30522, n_layer=6, d_model=384, n_head=12, d_ff=1536,
                            max_seq_len=512, layer_norm_eps=1e-12, dropout=0.0)
"""all-MiniLM-L6-v2's configuration (its config.json; the checkpoint's dropout 0.1 is a preset's dropouts)."""

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "gpt-small",
            TransformerConfig(vocab_size=BYTE_VOCAB_SIZE, n_layer=8, d_model=64, n_head=4, d_ff=256, max_seq_len=64),
            batch_size=4,
            seq_len=64,
            description="GPT-2-style, 8 layers, d_model 64, 4 heads, d_ff 256, byte vocabulary, B=4, T=64 (default)",
        ),
        ModelPreset(
            "gpt-tiny",
            TransformerConfig(vocab_size=BYTE_VOCAB_SIZE, n_layer=4, d_model=32, n_head=2, d_ff=64, max_seq_len=16),
            batch_size=2,
            seq_len=16,
            description="GPT-2-style, 4 layers, d_model 32, 2 heads, d_ff 64, B=2, T=16 (for quick checks)",
        ),
        ModelPreset(
            "minilm-l6",
            _MINILM,
            batch_size=8,
            seq_len=128,
            description="all-MiniLM-L6-v2 pretrained (BERT encoder, 6 layers, d_model 384, 12 heads), contrastive "
            f"fine-tuning on 4 passage pairs, B=8, T=128, dropout 0 and 0.1 (needs: {MINILM_INSTALL})",
            checkpoint=minilm_dir,
            schedules=("none", "full", "every_k(2)", "sqrt"),  # segments(3) and others: --schedules
            dropouts=(0.0, 0.1),
            hparams=FINE_TUNE,
            eager_dropouts=(),  # op by op a step costs tens of seconds here: jit and torch run both rates
            repeats=2,
            texts="passages",
        ),
        ModelPreset(
            "minilm-l6-short",
            _MINILM,
            batch_size=8,
            seq_len=16,
            description="all-MiniLM-L6-v2 at a short shape: 4 sentence pairs, B=8, T=16, dropout 0 and 0.1; "
            "activations are too small for remat to lower PyTorch's peak (for quick checks; docs/finetune.md)",
            checkpoint=minilm_dir,
            schedules=("none", "every_k(2)", "sqrt"),
            dropouts=(0.0, 0.1),
            hparams=FINE_TUNE,
            eager_dropouts=(0.0,),  # op by op a step costs seconds here; jit and torch run both rates
            repeats=2,
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``; raises ValueError listing the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(PRESETS)}") from None

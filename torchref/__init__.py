"""torchref: the GPT-2-style transformer and the remat schedules in PyTorch, the reference for jaxremat.

``torchref.model`` holds the single-device model; ``torchref.render`` applies a neutral schedule
(``jaxremat.spec``) with ``torch.utils.checkpoint`` (non-reentrant); ``torchref.reverse_loop`` is the
hand-written reverse segment loop; ``torchref.memory`` measures residual and peak bytes.
Imports ``jaxremat.spec`` only, never JAX.
"""

from .memory import PeakBytes, SavedActivationRecorder, peak_step_bytes
from .model import GPT, Block, lm_loss, split_tokens
from .render import forward_blocks, model_loss
from .reverse_loop import reverse_segment_loop

__all__ = [
    "GPT", "Block", "PeakBytes", "SavedActivationRecorder", "forward_blocks", "lm_loss", "model_loss",
    "peak_step_bytes", "reverse_segment_loop", "split_tokens",
]

"""torchref: the GPT-2-style transformer and the remat schedules in PyTorch, the reference for jaxremat.

Importable from here (``__all__`` lists every public name):

* the renderer: :func:`forward_blocks` (a schedule or plan ``"SCHEDULE+POLICY"`` over your own
  blocks, ``torch.utils.checkpoint`` non-reentrant), :func:`model_loss` (the GPT model under a
  schedule), :class:`ForwardState` / :class:`StateWriteError` / :func:`modules_of` (forward-pass
  state such as BatchNorm statistics updated once per step); :func:`is_recomputing` (True while a
  checkpointed segment is recomputed: forward hooks that must act once per step test it);
* policies: :class:`SelectiveCheckpoint` (a neutral policy as a selective-checkpoint
  ``context_fn``), :class:`SavedRecord`, :func:`activation` / :func:`current_name` (the
  activation regions policies are keyed on), :func:`check_selective` / :func:`check_no_effect`
  and :class:`RematPolicyWarning`;
* models: :class:`GPT`, :class:`Block`, :func:`lm_loss`, :func:`split_tokens`;
  :class:`Encoder`, :class:`EncoderBlock`, :func:`encoder_loss`, :func:`mean_pool`,
  :func:`contrastive_loss` (the BERT encoder);
  :func:`reverse_segment_loop` (the hand-written reverse segment loop of the GPT model);
* the remat doctor: :func:`doctor` (one training step watched: saved bytes per module, which
  checkpoints recompute and how often, reentrant checkpointing, selective policies that keep
  nothing; :class:`TorchDiagnosis`, :class:`ModuleReport`, :class:`TorchProblem`);
* memory tools: :class:`SavedActivationRecorder` (saved-tensor hooks), :func:`peak_step_bytes` /
  :class:`PeakBytes` (``MemTracker`` on CPU, the CUDA counters on a GPU),
  :class:`LiveBytesTracker` / :func:`step_peak_bytes` (lean peak of activations and temporaries),
  :func:`block_saved` (what one block keeps, tensor by tensor);
* the one-call planner: :func:`plan_blocks` (the least-recompute plan of your own blocks within a
  memory budget, measured and its gradients checked bitwise against ``none``: :mod:`torchref.fit`);
* the estimate without allocating: ``torchref.estimate(module_factory, input_shapes, plans=...)``
  (the module :mod:`torchref.estimate`, callable as its function :func:`torchref.estimate.estimate`:
  one training step under fake tensors with MemTracker).

PyTorch is imported at once (this is the PyTorch package); of jaxremat only ``jaxremat.spec`` is
imported, never JAX.
"""

from . import estimate  # the module, callable as its function: torchref.estimate(factory, shapes, plans=...)
from .block_memory import block_saved
from .doctor import ModuleReport, TorchDiagnosis, TorchProblem, doctor
from .encoder import Encoder, EncoderBlock, contrastive_loss, encoder_loss, mean_pool
from .fit import plan_blocks
from .forward_state import ForwardState, StateWriteError, modules_of
from .hooks import is_recomputing
from .lint import RematPolicyWarning, check_no_effect, check_selective
from .live_bytes import LiveBytesTracker, step_peak_bytes
from .memory import PeakBytes, SavedActivationRecorder, peak_step_bytes
from .model import GPT, Block, lm_loss, split_tokens
from .names import activation, current_name
from .policies import SavedRecord, SelectiveCheckpoint
from .render import forward_blocks, model_loss
from .reverse_loop import reverse_segment_loop

__all__ = [
    "Block", "Encoder", "EncoderBlock", "ForwardState", "GPT", "LiveBytesTracker", "ModuleReport", "PeakBytes",
    "RematPolicyWarning", "SavedActivationRecorder", "SavedRecord", "SelectiveCheckpoint", "StateWriteError",
    "TorchDiagnosis", "TorchProblem", "activation", "block_saved", "check_no_effect", "check_selective",
    "contrastive_loss", "current_name", "doctor", "encoder_loss", "estimate", "forward_blocks", "is_recomputing",
    "lm_loss", "mean_pool", "model_loss", "modules_of", "peak_step_bytes", "plan_blocks", "reverse_segment_loop",
    "split_tokens", "step_peak_bytes",
]

"""jaxremat: activation rematerialization schedules for JAX/Flax.

``jaxremat.spec`` (schedules, config, cost model) imports neither JAX nor PyTorch. The JAX parts
(``jaxremat.model``, ``jaxremat.render``, ``jaxremat.reverse_loop``, ``jaxremat.memory``) are
imported on first use so that the spec stays importable from the PyTorch reference.
"""

from .spec import *  # noqa: F401,F403
from .spec import __all__ as _spec_all

__all__ = list(_spec_all)

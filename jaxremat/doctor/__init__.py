"""The remat doctor: does the remat in a user's own training step keep what it names, survive
compilation, offload what it says? ``jaxremat.doctor(fn, *args)`` and ``python -m jaxremat.doctor``.

* :func:`doctor` (:mod:`jaxremat.doctor.core`) returns a :class:`Diagnosis`: every remat region
  (:class:`Region`) and every :class:`Problem`, of the kinds :data:`PROBLEM_KINDS`.
* ``python -m jaxremat.doctor path/to/file.py:function`` (:mod:`jaxremat.doctor.__main__`).

This package is itself callable: ``jaxremat.doctor(fn, *args)`` is ``jaxremat.doctor.doctor(fn, *args)``
whichever of the two Python finds under the name (the package once a submodule is imported, the
function when ``jaxremat.doctor`` is first read from ``jaxremat``).

docs/doctor.md describes the checks, what each measures and its limits.
"""

import sys
import types

from .core import doctor
from .program import program_kind
from .diagnosis import PROBLEM_KINDS, Diagnosis, Problem, Region

__all__ = ["Diagnosis", "PROBLEM_KINDS", "Problem", "Region", "doctor", "program_kind"]


class _CallablePackage(types.ModuleType):
    """This package's module type: calling it calls :func:`doctor`."""

    def __call__(self, fn, *args, **kwargs) -> Diagnosis:
        return doctor(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

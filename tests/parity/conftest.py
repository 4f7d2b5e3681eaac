"""Shared helpers of the parity tests: a plan run through the harness's one door into a framework."""

import pytest

from jaxremat.spec.plan import parse_plan
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

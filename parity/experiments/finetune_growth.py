"""``python -m parity.experiments.finetune_growth``: how JAX's error against PyTorch grows with fine-tuning steps.

Trains ``none`` without dropout in both frameworks on the preset's fixed batches (the fine-tuning
run's data order, :func:`parity.inputs.pretrained.preset_batches`) for each N of ``--steps``, through
each framework's ``train`` verb, and prints one JSON line per N: the loss error of every step
(:func:`parity.checks.compare.loss_error` over the first batch's term scale) and the trained weights'
largest relative error (:func:`parity.checks.compare.max_rel_err`), also in float32 eps per step.
The bound :func:`parity.cases.finetune.trained_bound` and the figures of docs/finetune.md come from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np

from jaxremat.spec.plan import parse_plan

from parity.checks.compare import loss_error, max_rel_err
from parity.cli.util import split_list
from parity.inputs.presets import get_preset
from parity.inputs.pretrained import FINE_TUNE, preset_batches
from parity.runners.framework import FRAMEWORK_NAMES, FRAMEWORKS, RunOptions, get_framework, loss_term_scale


def measure(model: str, steps: list[int], seed: int = 0) -> list[dict]:
    """One dict per N of ``steps``: ``steps``, ``loss_err_per_step``, ``trained_max_rel_err``, ``eps_per_step``."""
    preset = get_preset(model)
    cfg, params, batches = preset_batches(preset, "float32", seed, max(steps))
    cfg = cfg.replace(dropout=0.0)
    scale = loss_term_scale(cfg, params, batches[0])
    eps = float(np.finfo(np.float32).eps)
    rows = []
    for n in steps:
        options = RunOptions(hparams=dataclasses.replace(preset.hparams or FINE_TUNE, steps=n), seed=seed)
        runs = {fw: get_framework(fw).train(FRAMEWORKS[fw].measured_mode, cfg, params, batches[:n], parse_plan("none"),
                                            options) for fw in FRAMEWORK_NAMES}
        a, b = (runs[fw] for fw in FRAMEWORK_NAMES)
        err = max_rel_err(a.trained, b.trained)
        rows.append({"model": model, "steps": n, "loss_err_per_step": [loss_error(float(x), float(y), scale)
                                                                        for x, y in zip(a.losses, b.losses)],
                     "trained_max_rel_err": err, "eps_per_step": err / (eps * n),
                     "step_time_s": {fw: float(np.median(r.step_times_s)) for fw, r in runs.items()}})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse the options, print one JSON line per N; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m parity.experiments.finetune_growth",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="minilm-l6", help="a preset with a real checkpoint")
    parser.add_argument("--steps", default="2,8,16", help="comma-separated step counts N")
    args = parser.parse_args(argv)
    for row in measure(args.model, [int(s) for s in split_list(args.steps)]):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

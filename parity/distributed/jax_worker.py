"""The JAX worker of the distributed suite: ``python -m parity.distributed.jax_worker --devices 4 ...``.

Run as its own process because JAX reads its host-device count once, when it starts: the worker
sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (added to any flags already set) BEFORE
importing JAX. The flag only shapes the CPU backend; on a GPU machine JAX uses the real devices.
Each mesh is checked by :func:`parity.distributed.jax_checks.check_mesh`; the worker writes
``jax_rows.json`` (the meshes' :class:`parity.distributed.jax_checks.MeshReport` s) and one
safetensors file of ``none``'s gradients per mesh into ``--out``.

Exit codes: 0 the rows were written (pass or fail is in them); 2 bad input (one line on stderr).
"""

from __future__ import annotations

# Deferred imports: JAX (and every project module that loads it) must be imported only after XLA_FLAGS
# is set from --devices, so they are imported inside main().

import argparse
import json
import os
import sys
from pathlib import Path

from parity.inputs.pretrained import preset_inputs
from jaxremat.spec.grammar import split_top
from parity.inputs.presets import get_preset
from parity.inputs.train import AdamWConfig
ROWS_FILE = "jax_rows.json"

DEFAULT_MESHES = ("data=2", "fsdp=4", "data=2,model=2")
DEFAULT_PLANS = ("none", "full", "every_k(2)", "sqrt", "every_k(2)+save_qkv_proj")


def grads_file_name(mesh: str) -> str:
    """File name of a mesh's ``none`` gradients, e.g. ``jax_data2_model2_none_grads.safetensors``."""
    return "jax_" + mesh.replace("=", "").replace(",", "_") + "_none_grads.safetensors"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m parity.distributed.jax_worker",
                                description="Run remat plans on JAX meshes and write jax_rows.json.")
    p.add_argument("--devices", type=int, default=4, help="host devices to simulate on CPU (default 4)")
    p.add_argument("--meshes", default=";".join(DEFAULT_MESHES), help="';'-separated mesh specs")
    p.add_argument("--schedules", default=",".join(DEFAULT_PLANS), help="','-separated plans (none first)")
    p.add_argument("--model", default="gpt-small", help="model preset (default gpt-small)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    return p


def _split_plans(text: str) -> tuple[str, ...]:

    return tuple(s.strip() for s in split_top(text, ",") if s.strip())


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.devices < 1:
        print(f"--devices must be >= 1, got {args.devices}", file=sys.stderr)
        return 2
    flag = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), flag) if f)
    from parity.distributed.jax_checks import check_mesh

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        preset = get_preset(args.model)
        cfg, params, tokens = preset_inputs(preset, "float32", args.seed)
        plans = _split_plans(args.schedules)
        meshes = [m.strip() for m in args.meshes.split(";") if m.strip()]
        from jaxremat import sharding as shd

        for m in meshes:  # every mesh checked before any work starts
            shd.check_divides(m, cfg, tokens.shape[0])
            shd.make_mesh(m)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    hparams = preset.hparams or AdamWConfig()
    reports = [check_mesh(cfg, params, tokens, m, plans, hparams, out / grads_file_name(m)) for m in meshes]
    (out / ROWS_FILE).write_text(json.dumps({"model": preset.name, "devices": args.devices,
                                             "meshes": [r.to_json() for r in reports]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cross-framework errors over instruction sets, kernels and thread counts: what the tolerances rest on.

``python -m parity.experiments.tolerance_sweep`` runs the cross-framework comparison of the quick suite's model
(gpt-small: float32, float64 and bfloat16 compute) and of minilm-l6-short (float32, B=8, T=16) once per
:class:`Setting`, each in a fresh process (:mod:`parity.experiments.tolerance_worker`) started with that
setting's environment and CPU affinity, and writes every number (``sweep.json``) and the
distribution per model, dtype and quantity with each tolerance's margin (``sweep.md``) into
``--out``. It also reports, per setting, whether every schedule stayed bitwise equal to ``none``
inside each framework (remat must not change a bit under any setting).

The settings (defaults: every instruction set this CPU runs, times 1 and 2 threads, plus the
other dot kernels at the widest instruction set):

* XLA: ``--xla_cpu_max_isa`` (``SSE4_2``, ``AVX``, ``AVX2``, ``AVX512``) caps the instructions of
  the code XLA generates (fusions); matrix products run in YNNPACK fusions, whose kernels choose
  their instructions from the CPU at run time and ignore that flag, so the sweep also runs them on
  Eigen instead (``--xla_cpu_experimental_ynn_fusion_type=``, empty: no YNN fusions).
* PyTorch: ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``) selects ATen's vectorized
  kernels (softmax, layer norm, GELU, reductions); float32 matrix products run in MKL, whose
  ``MKL_CBWR=COMPATIBLE`` selects its portable code path instead of the CPU-specific one.
* threads: the process's CPU affinity (the first 1 or 2 CPUs; XLA:CPU sizes its thread pool
  from it at start-up), ``torch.set_num_threads``, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from parity.checks.compare import EPS
from parity.checks.compare import tolerance_for
from parity.report.format import md_table
from parity.runners.framework import FRAMEWORK_NAMES

XLA_ISAS = ("SSE4_2", "AVX", "AVX2", "AVX512")
ATEN_CAPABILITIES = ("default", "avx2", "avx512")
_CPU_FLAG = {"SSE4_2": "sse4_2", "AVX": "avx", "AVX2": "avx2", "AVX512": "avx512f",
             "default": None, "avx2": "avx2", "avx512": "avx512f"}
RUNS = {"gpt-small": {"float32": ("none", "sqrt"), "float64": ("none",), "bfloat16": ("none",)},
        "minilm-l6-short": {"float32": ("none", "sqrt", "every_k(2)")}}
"""Models of the sweep: the variants (:data:`parity.experiments.tolerance_worker.VARIANTS`) and schedules each runs.
The cross-framework error does not depend on the schedule (each schedule is bitwise ``none`` inside
each framework, which the sweep checks); the remat schedules are there for that check."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One combination of instruction sets, kernels and threads (see the module docstring).

    Attributes:
        xla_isa: value of ``--xla_cpu_max_isa``.
        aten: value of ``ATEN_CPU_CAPABILITY``.
        threads: intra-op threads of both frameworks (>= 1).
        xla_dots: ``ynn`` (XLA's default) or ``eigen`` (YNNPACK fusions off).
        mkl: ``auto`` (MKL's CPU-specific path) or ``COMPATIBLE`` (``MKL_CBWR=COMPATIBLE``).
    """

    xla_isa: str = "AVX2"
    aten: str = "avx2"
    threads: int = 2
    xla_dots: str = "ynn"
    mkl: str = "auto"

    def __post_init__(self):
        if self.xla_isa not in XLA_ISAS or self.aten not in ATEN_CAPABILITIES:
            raise ValueError(f"unknown instruction set in {self}; XLA: {XLA_ISAS}, ATen: {ATEN_CAPABILITIES}")
        if self.threads < 1 or self.xla_dots not in ("ynn", "eigen") or self.mkl not in ("auto", "COMPATIBLE"):
            raise ValueError(f"bad setting {self}: threads >= 1, xla_dots ynn|eigen, mkl auto|COMPATIBLE")

    @property
    def name(self) -> str:
        """Short label, e.g. ``xla=AVX2 aten=avx2 t=2`` (kernel variants appended)."""
        extra = (" dots=eigen" if self.xla_dots == "eigen" else "") + (" mkl=COMPATIBLE" if self.mkl != "auto" else "")
        return f"xla={self.xla_isa} aten={self.aten} t={self.threads}{extra}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a worker process under this setting (``base``: default os.environ)."""
        env = dict(os.environ if base is None else base)
        for key in ("XLA_FLAGS", "ATEN_CPU_CAPABILITY", "MKL_CBWR"):
            env.pop(key, None)
        flags = [f"--xla_cpu_max_isa={self.xla_isa}"]
        if self.xla_dots == "eigen":
            flags.append("--xla_cpu_experimental_ynn_fusion_type=")
        env["XLA_FLAGS"] = " ".join(flags)
        env["ATEN_CPU_CAPABILITY"] = self.aten
        if self.mkl != "auto":
            env["MKL_CBWR"] = self.mkl
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        return env


def cpu_flags() -> set[str]:
    """The instruction-set flags of this CPU (``/proc/cpuinfo``; empty set where it does not exist)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def supported(names, flags: set[str]) -> list[str]:
    """The instruction sets of ``names`` this CPU runs (``default`` always)."""
    return [n for n in names if _CPU_FLAG[n] is None or _CPU_FLAG[n] in flags]


def default_settings(flags: set[str] | None = None, threads=(1, 2), isas=None) -> list[Setting]:
    """Every supported XLA ISA x ATen capability x thread count, plus Eigen dots and MKL COMPATIBLE.

    ``isas``: only these XLA instruction sets (``--isa``; the kernel variants run at the widest of them).

    Raises:
        ValueError: ``isas`` names an instruction set that is unknown or that this CPU lacks.
    """
    flags = cpu_flags() if flags is None else flags
    isas_here, caps = supported(XLA_ISAS, flags), supported(ATEN_CAPABILITIES, flags)
    if isas is None:
        isas = isas_here
    else:
        bad = [i for i in isas if i not in isas_here]
        if bad or not isas:
            raise ValueError(f"--isa {','.join(isas) or repr('')}: this CPU runs {', '.join(isas_here)}; "
                             "give one or more of them")
        isas = [i for i in isas_here if i in isas]
    grid = [Setting(i, c, t) for i in isas for c in caps for t in threads]
    top_isa, top_cap = isas[-1], caps[-1]
    kernels = [Setting(top_isa, top_cap, t, xla_dots="eigen") for t in threads]
    kernels += [Setting(top_isa, top_cap, t, mkl="COMPATIBLE") for t in threads]
    return grid + kernels


def run_setting(setting: Setting, model: str, variants: dict, eager: bool = True,
                timeout_s: float = 1800, cpus=None, flags: set[str] | None = None) -> dict:
    """Run :mod:`parity.experiments.tolerance_worker` under ``setting`` in a fresh process; its result object.

    Args:
        setting: instruction sets, kernels and threads.
        model: preset name.
        variants: ``{variant: schedule names, none first}``, variants from
            :data:`parity.experiments.tolerance_worker.VARIANTS`.
        eager: also run JAX op by op on ``none`` (float32).
        timeout_s: wall-clock limit of the worker, seconds.
        cpus: the CPUs to pin the worker to (default: the first ``setting.threads`` of this
            process's affinity); two 1-thread workers on different CPUs can run at once.
        flags: this CPU's instruction-set flags (default :func:`cpu_flags`; an empty set skips the check).

    Raises:
        RuntimeError: the worker failed or printed no result (its standard error is in the message).
        ValueError: this machine has fewer CPUs than ``setting.threads``, or lacks an instruction
            set the setting names: ``ATEN_CPU_CAPABILITY=avx512`` on a CPU without AVX-512 is taken
            as given and the first vectorized kernel dies of SIGILL (torch 2.13.0), while XLA caps
            ``--xla_cpu_max_isa=AVX512`` at the host's AVX2 silently (a result labelled AVX-512
            that is not).
    """
    flags = cpu_flags() if flags is None else flags
    missing = [n for n in (setting.xla_isa, setting.aten) if flags and not supported([n], flags)]
    if missing:
        raise ValueError(f"{setting.name}: this CPU lacks {', '.join(_CPU_FLAG[n] for n in missing)} "
                         f"(/proc/cpuinfo); run the settings of default_settings() instead")
    allowed = sorted(os.sched_getaffinity(0))
    cpus = sorted(cpus) if cpus is not None else allowed[: setting.threads]
    if len(cpus) != setting.threads or not set(cpus) <= set(allowed):
        raise ValueError(f"{setting.name} needs {setting.threads} of this process's CPUs {allowed}, got {cpus}")
    # The worker pins itself before jax and torch load: a preexec_fn would make subprocess fork
    # this (multithreaded, once JAX is loaded) process and run Python in the child before exec.
    spec = {"model": model, "variants": {v: list(names) for v, names in variants.items()},
            "threads": setting.threads, "eager": eager, "cpus": cpus}
    proc = subprocess.run(
        [sys.executable, "-m", "parity.experiments.tolerance_worker", json.dumps(spec)], env=setting.env(),
        capture_output=True, text=True, timeout=timeout_s,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker under {setting.name} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    result = json.loads(lines[-1])
    result["setting"] = dataclasses.asdict(setting) | {"name": setting.name}
    return result


def rows(results: list[dict]):
    """Flatten results: one dict per (setting, model, variant, schedule, mode) with both errors.

    ``ok`` is judged against the current :data:`parity.checks.compare.TOLERANCES` (``tolerance_loss``,
    ``tolerance_grads``); ``ok_when_measured`` is the worker's verdict under the table it ran with.
    """

    for r in results:
        for v in r["variants"]:
            bounds = tolerance_for(v["variant"], "loss").bound, tolerance_for(v["variant"], "grads").bound
            for s in v["schedules"]:
                for mode, x in (("jit", s), ("eager", s.get("eager"))):
                    if x is None:
                        continue
                    yield {"setting": r["setting"]["name"], "model": r["spec"]["model"], "variant": v["variant"],
                           "schedule": s["schedule"], "mode": mode, "loss_err": x["loss_err"],
                           "grads_err": x["max_rel_err_grads"], "worst_grad": x["worst_grad"],
                           "loss_abs_diff": x["loss_abs_diff"], "tolerance_loss": bounds[0],
                           "tolerance_grads": bounds[1], "ok_when_measured": x["ok"],
                           "ok": x["loss_err"] <= bounds[0] and x["max_rel_err_grads"] <= bounds[1]}


def summary(results: list[dict]) -> list[dict]:
    """Per (model, variant, quantity, JAX mode): the largest error, where it occurred, the bound, the margin.

    The bound is the current :data:`parity.checks.compare.TOLERANCES` entry, not the one recorded with
    the results (so a sweep measured before a change of the table shows the margins after it).
    """

    out = {}
    for row in rows(results):
        for q, key in (("loss", "loss_err"), ("grads", "grads_err")):
            bound = row[f"tolerance_{q}"]
            k = (row["model"], row["variant"], q, row["mode"])
            if k not in out or row[key] > out[k]["max_err"]:
                out[k] = {"model": row["model"], "dtype": row["variant"], "quantity": q, "mode": row["mode"],
                          "max_err": row[key], "max_err_eps": row[key] / EPS[row["variant"]],
                          "where": f"{row['setting']}, {row['schedule']}"
                          + (f", {row['worst_grad']}" if q == "grads" else ""),
                          "tolerance": bound, "margin": bound / row[key] if row[key] > 0 else float("inf")}
    return list(out.values())


def bitwise_findings(results: list[dict]) -> list[str]:
    """Every (setting, model, variant, schedule, framework) where remat was not bitwise equal to none."""
    found = []
    for r in results:
        for v in r["variants"]:
            for s in v["schedules"]:
                for fw in FRAMEWORK_NAMES:
                    b = s.get(f"{fw}_vs_none")
                    if b is not None and not b["equal"]:
                        found.append(f"{r['setting']['name']} {r['spec']['model']} {v['variant']} {s['schedule']} "
                                     f"{fw}: max ULP {b['max_ulp']}, {', '.join(b['mismatched'][:4])}")
    return found


def markdown(results: list[dict]) -> str:
    """The sweep as Markdown: the distribution table, per-setting maxima, bitwise findings.

    ``JAX bits`` / ``PyTorch bits``: the start of :func:`parity.experiments.tolerance_worker.digest` of the
    ``none`` loss and gradients (JAX under ``jit``): settings sharing a digest computed the same bits.
    """
    table = [[s["model"], s["dtype"], s["quantity"], s["mode"], f"{s['max_err']:.2e}", f"{s['max_err_eps']:.3g}",
              s["where"], f"{s['tolerance']:.2e}", f"{s['margin']:.1f}x"] for s in summary(results)]
    lines = [md_table(("model", "dtype", "quantity", "JAX", "max error", "in eps", "where", "tolerance", "margin"), table)]
    per_setting = []
    for r in results:
        regs = r.get("xla_vector_registers")
        regs = "-" if not regs else ", ".join(f"{k} {n}" for k, n in regs.items() if n)
        for v in r["variants"]:
            sub = [x for x in rows([{**r, "variants": [v]}])]
            none = v["schedules"][0]
            bits = [none.get(f"{fw}_digest", "-")[:6] for fw in FRAMEWORK_NAMES]
            per_setting.append([r["setting"]["name"], r["spec"]["model"], v["variant"],
                                f"{max(x['loss_err'] for x in sub):.2e}", f"{max(x['grads_err'] for x in sub):.2e}",
                                *bits, regs, r["aten_capability"], str(none.get("ynn_fusions", "-"))])
    lines += ["", md_table(("setting", "model", "dtype", "max loss error", "max grads error", "JAX bits", "PyTorch bits",
                            "XLA registers", "ATen", "YNN fusions"), per_setting)]
    found = bitwise_findings(results)
    lines += ["", f"Within-framework bitwise (each schedule against none, same process): "
              f"{'all equal' if not found else f'{len(found)} not equal'}"] + [f"- {f}" for f in found]
    return "\n".join(lines) + "\n"


def _run_all(jobs: list[tuple[Setting, str]], eager: bool, on_result) -> None:
    """Run every (setting, model) job, two at a time: two 1-thread jobs on different CPUs, else side by side.

    JAX op by op (``eager``) runs in the 1-thread jobs only (it costs seconds a step). Only the
    thread counts are fixed (each framework sizes its thread pool from them); two jobs sharing
    CPUs run slower but compute the same bits.
    """

    cpus = sorted(os.sched_getaffinity(0))
    width = 2 if len(cpus) >= 2 else 1
    single = [j for j in jobs if j[0].threads == 1]
    with ThreadPoolExecutor(width) as pool:
        for group, pinned in ((single, True), ([j for j in jobs if j not in single], False)):
            for i in range(0, len(group), width):
                futures = [pool.submit(run_setting, s, m, RUNS[m], eager and s.threads == 1,
                                       cpus=[cpus[k]] if pinned else None)
                           for k, (s, m) in enumerate(group[i:i + width])]
                for f in futures:
                    on_result(f.result())


def main(argv=None) -> int:
    """CLI: run the sweep, write ``sweep.json`` and ``sweep.md``; exit 1 if a row exceeded its tolerance."""
    ap = argparse.ArgumentParser(prog="python -m parity.experiments.tolerance_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(RUNS), help=f"comma-separated, from {', '.join(RUNS)}")
    ap.add_argument("--out", default="tolerance-sweep", help="output folder (default tolerance-sweep/)")
    ap.add_argument("--no-eager", action="store_true",
                    help="skip JAX op by op (run on none, float32, in the 1-thread settings)")
    ap.add_argument("--resume", action="store_true", help="keep the results in --out/sweep.json, run the rest")
    ap.add_argument("--isa", default=None, help=f"comma-separated XLA instruction sets to run, from {', '.join(XLA_ISAS)} "
                    "(default: every one this CPU runs)")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not models or any(m not in RUNS for m in models):
        print(f"error: --models takes names from {', '.join(RUNS)}, got {args.models!r}", file=sys.stderr)
        return 2
    try:
        settings = default_settings(isas=None if args.isa is None else [i.strip() for i in args.isa.split(",") if i.strip()])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = json.loads((out / "sweep.json").read_text()) if args.resume and (out / "sweep.json").exists() else []
    done = {(r["setting"]["name"], r["spec"]["model"]) for r in results}
    jobs = [(s, m) for s in settings for m in models if (s.name, m) not in done]

    def on_result(r):
        results.append(r)
        print(f"done: {r['setting']['name']} {r['spec']['model']}", file=sys.stderr, flush=True)
        (out / "sweep.json").write_text(json.dumps(results, indent=1))

    _run_all(jobs, not args.no_eager, on_result)
    text = markdown(results)
    (out / "sweep.md").write_text(text)
    print(text)
    return 0 if all(r["ok"] for r in rows(results)) else 1


if __name__ == "__main__":
    sys.exit(main())

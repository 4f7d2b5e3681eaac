"""The distributed suite's report sections: one table per mesh, per-device memory beside its prediction.

Called by :func:`parity.report.suite_report.markdown` and :func:`parity.report.suite_report.print_tables`
when the report has a ``distributed`` key (docs/report-schema.md).
"""

from __future__ import annotations

from rich.text import Text

from parity.report.format import fmt_bit, fmt_bytes, md_table
from parity.report.terminal import fitted_table

MESH_COLUMNS = ("plan", "status", "grads bitwise", "weights bitwise", "max ULP", "exception", "ref ok", "ref err",
                "params/dev", "pred", "grads/dev", "opt/dev", "act/dev", "act pred", "act/none", "peak/dev")


PROCESS_COLUMNS = ("vs 1 process", "1-proc ULP", "1-proc exception")
"""Columns added for a mesh spread over several processes: each plan against the same mesh in one process."""


def columns(section: dict) -> tuple[str, ...]:
    """The columns of one mesh section: :data:`MESH_COLUMNS`, plus :data:`PROCESS_COLUMNS` for several processes."""
    return MESH_COLUMNS + (PROCESS_COLUMNS if section.get("processes", 1) > 1 else ())


def title(section: dict) -> str:
    """A mesh section's title, e.g. ``jax fsdp=4 (fully_sharded), 2 processes``."""
    p = section.get("processes", 1)
    return (f"{section['framework']} {section['mesh']} ({section['layout']})"
            + (f", {p} processes" if p > 1 else ""))


def probe_line(section: dict) -> str | None:
    """The collective probe of a multi-process section in words (None without one)."""
    probe = section.get("probe")
    if not probe or section.get("processes", 1) == 1:
        return None
    parts = []
    for axis, p in probe.items():
        orders = ", ".join("?" if o is None else "(" + "+".join(f"x{i}" for i in o) + ")" for o in p["orders"])
        parts.append(f"`{axis}`: {p['device_order']:.0%} of elements summed in device order; per chunk {orders}")
    return ("Collective probe (psum of 1024 float32 per device over each axis, measured in these processes; "
            "docs/sharding.md, 'Several processes'): " + "; ".join(parts) + ".")



def one_process_line(section: dict) -> str | None:
    """The measurements behind each plan of a multi-process section that is not bitwise against one process.

    Plans with the same measurements share one entry. None when every plan is bitwise (or no facts).
    """
    facts = section.get("one_process") or {}
    if not facts or section.get("processes", 1) == 1:
        return None
    groups: dict[str, list[str]] = {}
    eps = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    for plan, f in facts.items():
        b = f.get("bound_eps") or {}
        bounds = " / ".join("-" if b.get(k) is None else f"{b[k]:g}" for k in ("loss", "grads", "trained"))
        text = (f"same HLO {fmt_bit(f.get('same_hlo'))}, probes differ {fmt_bit(f.get('probes_differ'))}, "
                f"loss {eps(f.get('loss_eps'))} eps, gradients {eps(f.get('grads_eps'))} eps, "
                f"trained weights {eps(f.get('trained_eps'))} eps (bounds {bounds} eps)")
        groups.setdefault(text, []).append(plan)
    return ("Against one process, not bitwise (the loss relative to itself, gradients and trained weights "
            "relative per tensor to its largest entry; exception `collective-summation-order` needs all of these): "
            + "; ".join(f"{', '.join(f'`{p}`' for p in plans)}: {text}" for text, plans in groups.items()) + ".")



def mesh_rows(section: dict) -> list[list[str]]:
    """One mesh section's rows as display strings, in :func:`columns` order."""
    rows = section["rows"]
    none_act = next((r["memory"]["activation_bytes"] for r in rows if r["plan"] == "none" and r.get("memory")), None)
    out = []
    for r in rows:
        m = r.get("memory") or {}
        pred = m.get("predicted") or {}
        act = m.get("activation_bytes")
        ratio = "-" if not act or not none_act else f"{act / none_act:.2f}"
        err = r.get("reference_err")
        out.append([r["plan"], r["status"], fmt_bit(r.get("grads_bitwise")), fmt_bit(r.get("weights_bitwise")),
                    str(r.get("max_ulp", 0)), r.get("exception") or "-", fmt_bit(r.get("reference_ok")),
                    "-" if err is None else f"{err:.1e}", fmt_bytes(m.get("params_bytes")), fmt_bytes(pred.get("params_bytes")),
                    fmt_bytes(m.get("grads_bytes")), fmt_bytes(m.get("opt_state_bytes")), fmt_bytes(act),
                    fmt_bytes(pred.get("activation_bytes")), ratio, fmt_bytes(m.get("peak_bytes"))])
        if section.get("processes", 1) > 1:
            ulp = r.get("one_process_max_ulp")
            out[-1] += [fmt_bit(r.get("one_process_bitwise")), "-" if ulp is None else str(ulp),
                        r.get("one_process_exception") or "-"]
    return out




def counts(report: dict) -> tuple[int, int]:
    """``(passed, total)`` distributed rows."""
    rows = [r for m in report["distributed"]["meshes"] for r in m["rows"]]
    return sum(r["status"] == "pass" for r in rows), len(rows)


def markdown_sections(report: dict) -> list[str]:
    """Markdown lines: a section per mesh, the exceptions and errors."""
    d = report["distributed"]
    parts = ["## Past one device (distributed suite)", "",
             f"JAX: {d['devices']} devices (CPU: forced host devices). Each plan is compared with `none` on the same "
             "mesh byte for byte (loss, gradients, weights after the AdamW steps); `ref` = `none`'s gradients against "
             "the single-device reference named in report.json (`reference`). Memory is per device (JAX: compiled "
             "memory_analysis of the SPMD program, parameter/gradient/optimizer shards on device 0); `pred` = "
             "parameters over the axis that splits them, `act pred` = single-device activations over the batch "
             "shards (tensor parallel: times Korthikanti et al.'s ratio) plus the per-layer collective buffers "
             "(fully sharded: one layer gathered whole and its whole gradient; data parallel: one layer's gradient "
             "all-reduce); PyTorch: single-device activations over the ranks, with the gradients resident for DDP "
             "(its buckets), plus FSDP2's root parameters and three whole blocks gathered. docs/sharding.md and "
             "docs/sharding-torch.md explain each column.", ""]
    if d.get("processes", 1) > 1:
        parts += [f"Each JAX mesh also ran spread over {d['processes']} processes (`jax.distributed.initialize` over "
                  "127.0.0.1, CPU collectives over gloo; the path that spans hosts): its section checks each plan "
                  "against `none` of the same processes and, in `vs 1 process`, against the same plan on the same "
                  "mesh in one process, byte for byte.", ""]
    parts += [line for why in (d.get("not_run") or {}).values() for line in (why, "")]
    for m in d["meshes"]:
        parts += [f"### {title(m)}", "", md_table(columns(m), mesh_rows(m)), ""]
        if probe_line(m):
            parts += [probe_line(m), ""]
        if one_process_line(m):
            parts += [one_process_line(m), ""]
        if m.get("full_batch_err") is not None:
            parts += [f"Full-batch single-device gradient vs this mesh's `none`: max rel err {m['full_batch_err']:.2e} "
                      f"(summation order; not the reference). Mean-of-shards reference bitwise: "
                      f"{fmt_bit(m.get('reference_bitwise'))}.", ""]
    exc = sorted({(title(m), r["plan"], e) for m in d["meshes"] for r in m["rows"]
                  for e in (r.get("exception"), r.get("one_process_exception")) if e})
    if exc:
        parts += ["Exceptions (not bitwise, measured and explained in docs/sharding.md):", ""]
        parts += [f"- {t} {s}: `{e}`" for t, s, e in exc] + [""]
    errors = [r for m in d["meshes"] for r in m["rows"] if r["status"] == "error"]
    parts += [f"- error {r['framework']} {r['mesh']} {r['plan']}: `{r['error']}`" for r in errors]
    failed = [(title(m), r["plan"]) for m in d["meshes"] for r in m["rows"] if r["status"] == "fail"]
    parts += [f"- failed {t} {s}" for t, s in failed]
    return parts


TERMINAL_MESH_COLUMNS = ("plan", "status", "grads bitwise", "weights bitwise", "ref ok", "act/dev", "act/none",
                         "peak/dev", "vs 1 process")
"""The mesh columns the terminal shows without ``--wide`` (those of :func:`columns` that a section has)."""


def print_mesh_tables(report: dict, console, wide: bool = False) -> None:
    """Print one table per mesh (``wide``: every column of :func:`columns`, else :data:`TERMINAL_MESH_COLUMNS`)."""

    for m in report["distributed"]["meshes"]:
        cols = columns(m)
        keep = [i for i, c in enumerate(cols) if wide or c in TERMINAL_MESH_COLUMNS]
        rows = [[row[i] for i in keep] for row in mesh_rows(m)]
        console.print(fitted_table(title(m), [cols[i] for i in keep], rows, left=[True, True],
                                   styles=[None if r["status"] == "pass" else "red" for r in m["rows"]]))
    for why in (report["distributed"].get("not_run") or {}).values():
        console.print(Text(why))

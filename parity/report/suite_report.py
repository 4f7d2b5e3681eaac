"""Writing the parity report: ``report.json``, ``report.md``, ``report.html`` and a terminal table (rich).

Files are written atomically (:mod:`parity.report.files`: temporary file, ``fsync``, ``os.replace``), so
an interrupted run or a full disk never leaves a half-written report; ``report.json`` is strict
JSON (non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"``; ``"nonfinite_encoding":
"string"`` says so). A previous report in the output directory is kept: it is moved to
``previous/<UTC timestamp>/`` unless ``overwrite`` is set. Everything printed is plain text,
never console markup (a ``[name]`` in a value is printed as it is).
"""

from __future__ import annotations

import datetime as _dt
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jaxremat.models import get_model, registered_models

from parity.report.files import NONFINITE_ENCODING, atomic_write, json_text
from parity.report.html import HTML_NAME, write_html

from parity.checks.verdict import report_passed
from parity.report import distributed_report

REPORT_FILES = ("report.json", "report.md", HTML_NAME)

SCHEMA_VERSION = 5
"""report.json schema: 5 lets a segment plan's case list its policies (``policy`` joined by ``,``;
``block_names``/``expected_names`` one entry per policy); 4 names each quantity once
(``saved_bytes``, ``saved_ratio``); 3 wrote non-finite floats as strings and added environment and
timing spreads (docs/report-schema.md)."""


SUITE_MARKER = ".parity-suite"
"""A file the distributed suite writes into the folder it creates (``distributed/``): ``--overwrite`` removes a
folder of the previous report only when it carries this marker, never a folder the user made."""


class OutputDirError(Exception):
    """The output directory cannot be used (not a directory, not writable)."""


def writable_dir(out: Path) -> Path:
    """``out`` as a directory that exists (created with its parents) and can be written (a file is made and removed).

    Raises:
        OutputDirError: ``out`` exists and is not a directory, or cannot be created or written.
    """
    try:
        if out.exists() and not out.is_dir():
            raise OutputDirError(f"output path {out} exists and is not a directory; pass another --out")
        out.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-", delete=True)
        probe.close()
    except OSError as exc:
        raise OutputDirError(f"cannot write to output directory {out}: {exc.strerror or exc}; pass a writable --out") from None
    return out


def prepare_out_dir(out: Path, overwrite: bool, files: tuple[str, ...] = REPORT_FILES) -> str | None:
    """Create ``out`` if needed (:func:`writable_dir`) and keep a previous report (``files``); return a message
    about what was kept. With ``overwrite`` nothing is kept: the report's files are rewritten by the new
    run, and a folder among ``files`` (a name ending in ``/``: the distributed suite's ``distributed/``) is removed first, with the
    previous report's files that point into it, but only when the folder carries :data:`SUITE_MARKER`
    (the suite wrote it).

    Raises:
        OutputDirError: ``out`` exists and is not a directory, or cannot be written; with ``overwrite``, a
            folder name among ``files`` is taken by something the suite did not write (a file, a link,
            a folder without the marker), or cannot be removed.
    """
    writable_dir(out)
    existing = [f for f in files if (out / f).exists() or (out / f).is_symlink()]
    folders = [f for f in files if f.endswith("/")]  # the suite's folders ("distributed/"); the rest are files
    if overwrite:  # a folder of the previous report goes whole (its files would mix with the new run's)
        for f in folders:
            path = out / f
            if f in existing and (path.is_symlink() or not path.is_dir() or not (path / SUITE_MARKER).is_file()):
                raise OutputDirError(f"{path} is not a folder this suite wrote (no {SUITE_MARKER} file in it), so "
                                     "--overwrite leaves it alone; move it away or pass another --out")
        try:
            for f in existing:
                path = out / f
                if f in folders:
                    shutil.rmtree(path)
                elif any(g in existing for g in folders):  # the old report.json would point into the removed folder
                    path.unlink()
        except OSError as exc:
            raise OutputDirError(f"cannot replace the previous {path}: {exc.strerror or exc}; remove it or pass "
                                 "another --out") from None
        return None
    if not existing:
        return None
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    keep = out / "previous" / stamp
    try:
        keep.mkdir(parents=True)
        for f in existing:
            shutil.move(str(out / f), str(keep / f))
    except OSError as exc:
        raise OutputDirError(
            f"cannot keep the previous report in {keep}: {exc.strerror or exc}; move it away or pass --overwrite"
        ) from None
    return f"previous report kept in {keep} (use --overwrite to replace it instead)"


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt_ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _block_name_entries(case: dict) -> list[tuple[str, dict, bool | None]]:
    """``[(policy, measured block names, as declared)]`` of one case: one entry, or one per policy of a
    segment plan (whose ``block_names`` is a list of ``{"policy": name, ...}``)."""
    names = case.get("block_names")
    if not names:
        return []
    if isinstance(names, dict):
        return [(case["policy"], names, case.get("names_ok"))]
    expected = {e["policy"]: e for e in case.get("expected_names") or []}
    return [(n["policy"], n, n["kept"] == expected.get(n["policy"], {}).get("kept")
             and n["offloaded"] == expected.get(n["policy"], {}).get("offloaded")) for n in names]


def _bit(x) -> str:
    return "-" if x is None else ("yes" if x else "NO")


CASE_COLUMNS = ("framework", "mode", "dtype", "schedule", "status", "grads bitwise", "weights bitwise",
                "reverse loop", "max ULP", "names as declared", "saved", "saved/none", "saved pred", "offloaded", "peak",
                "peak/none", "peak act", "peak act pred", "peak act/none", "units/none",
                "recomputed", "step ms", "time/none", "time/none range")


def _fmt_gap(g) -> str:
    """A prediction's relative gap to the measurement; '!' marks one above 10%."""
    if g is None:
        return "-"
    return f"{g:+.0%}" + (" !" if abs(g) > 0.10 else "")


def _fmt_saving(sv: dict | None) -> str:
    """Measured peak activation over none's; ' NO' when a promised saving is not realized."""
    if not sv or sv.get("peak_activation_ratio") is None:
        return "-"
    return f"{sv['peak_activation_ratio']:.2f}" + (" NO" if sv.get("realized") is False else "")


def _schedule_label(c: dict) -> str:
    return c["schedule"] if not c.get("variant") else f"{c['variant']}: {c['schedule']}"


def case_row(c: dict) -> list[str]:
    """One report case as display strings, in :data:`CASE_COLUMNS` order."""
    return [
        c["framework"], c["mode"], c["dtype"], _schedule_label(c), c["status"],
        _bit(c["grads_bitwise_equal"]), _bit(c["weights_bitwise_equal"]), _bit(c["reverse_loop_bitwise_equal"]),
        "-" if c["max_ulp"] is None else str(c["max_ulp"]), _bit(c.get("names_ok")),
        _fmt_bytes(c["saved_bytes"]), _fmt_ratio(c["saved_ratio"]), _fmt_gap(c.get("saved_gap")),
        "-" if not c.get("offloaded_bytes") else _fmt_bytes(c["offloaded_bytes"]),
        _fmt_bytes(c["peak_bytes"]), _fmt_ratio(c["peak_ratio"]),
        _fmt_bytes(c.get("peak_activation_bytes")), _fmt_gap(c.get("peak_gap")), _fmt_saving(c.get("saving")),
        _fmt_ratio(c["predicted_unit_ratio"]),
        str(c["recomputed_blocks"]),
        "-" if c["step_time_s"] is None else f"{1e3 * c['step_time_s']:.1f}", _fmt_ratio(c["time_overhead"]),
        _fmt_range(c.get("time_overhead_range")),
    ]


def _fmt_range(r) -> str:
    return "-" if not r else f"{r[0]:.2f}-{r[1]:.2f}"


_VERDICT_WORDS = {"fail": "failed", "no_saving": "saved no memory", "over_budget": "went over their memory budget",
                  "error": "errored"}


def verdict(report: dict) -> str:
    """One line: passed or not, how many cases and comparisons, and how many timings beat their noise."""
    cases = report["cases"]
    counts = {k: sum(c["status"] == k for c in cases) for k in ("pass", "fail", "no_saving", "over_budget", "error")}
    cross = report.get("cross_framework") or []
    head = ("INCOMPLETE" if report.get("complete") is False else
            "PASS" if report_passed(report) else "FAIL")
    parts = [f"{counts['pass']} of {len(cases)} cases passed"
             + "".join(f", {counts[k]} {_VERDICT_WORDS[k]}" for k in ("fail", "no_saving", "over_budget", "error") if counts[k])]
    if not cases and report.get("distributed"):
        parts = []  # the distributed suite has rows, not cases
    if report.get("distributed"):
        ok, total = distributed_report.counts(report)
        parts.append(f"{ok} of {total} distributed rows passed")
    if cross:
        parts.append(f"JAX vs PyTorch within tolerance in {sum(bool(x['ok']) for x in cross)} of {len(cross)}")
    timed = [c for c in cases if c.get("time_overhead_range") and c["schedule"] != "none"]
    if timed:
        resolved = sum(not (r[0] <= 1.0 <= r[1]) for r in (c["time_overhead_range"] for c in timed))
        rest = len(timed) - resolved
        parts.append(f"timing: {resolved} of {len(timed)} time/none ratios lie outside the run-to-run spread"
                     + (f" (the other {rest} {'is' if rest == 1 else 'are'} noise at these repeats)" if rest else ""))
    return f"**Verdict: {head}** - " + "; ".join(parts) + "."


def case_table(report: dict) -> tuple[tuple[str, ...], list[list[str]]]:
    """Columns and rows of the case table; a ``dropout`` column is added when some case has dropout."""
    rows = [case_row(c) for c in report["cases"]]
    if not any(c.get("dropout") for c in report["cases"]):
        return CASE_COLUMNS, rows
    i = CASE_COLUMNS.index("dtype") + 1
    return (CASE_COLUMNS[:i] + ("dropout",) + CASE_COLUMNS[i:],
            [r[:i] + [f"{c.get('dropout', 0.0):g}"] + r[i:] for r, c in zip(rows, report["cases"])])


PEER_COLUMNS = ("check", "dtype", "max rel err", "tolerance", "ok", "note")


def peer_row(x: dict) -> list[str]:
    """One peer comparison (:mod:`parity.checks.peer`) as display strings, in :data:`PEER_COLUMNS` order."""
    err = "-" if x["max_rel_err"] is None else f"{x['max_rel_err']:.2e}"
    tol = "-" if x["tolerance"] is None else f"{x['tolerance']:.0e}"
    ok = {True: "yes", False: "NO", None: "skipped"}[x["ok"]]
    return [x["check"], x["dtype"], err, tol, ok, x["note"]]


CROSS_COLUMNS = ("dtype", "schedule", "loss err", "loss tol", "grads err", "grads tol", "ok")


def cross_row(x: dict) -> list[str]:
    """One cross-framework comparison as display strings, in :data:`CROSS_COLUMNS` order.

    ``loss err`` is the loss difference over the loss's term scale (:func:`parity.checks.compare.cross_check`);
    rows without it (older reports, stress rows) show the plain relative error, marked ``(rel)``.
    """
    f = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
    schedule = x["schedule"] if not x.get("variant") else f"{x['variant']}: {x['schedule']}"
    if "loss_err" in x:
        loss, loss_tol = f(x["loss_err"]), f(x["tolerance_loss"])
    else:
        loss, loss_tol = f"{f(x.get('max_rel_err_loss'))} (rel)", f(x.get("tolerance"))
    return [x["dtype"], schedule, loss, loss_tol, f(x.get("max_rel_err_grads")), f(x.get("tolerance")),
            "yes" if x["ok"] else "NO"]


def print_tables(report: dict, console: Console | None = None) -> None:
    """Print the case table and the cross-framework table to the terminal."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # pipes and CI logs: do not squeeze the table into 80 columns
            console = Console(width=240)
    if report.get("distributed") and not report["cases"]:
        distributed_report.print_mesh_tables(report, console)
        return
    t = Table(title=Text(f"parity: {report['model']} ({report['suite']} suite)"), show_lines=False)
    columns, rows = case_table(report)
    for col in columns:
        t.add_column(col, justify="right" if col not in ("framework", "mode", "dtype", "schedule", "status") else "left")
    for c, row in zip(report["cases"], rows):
        style = {"pass": None, "fail": "red", "no_saving": "red", "over_budget": "red", "error": "bold red"}.get(c["status"])
        t.add_row(*map(Text, row), style=style)
    console.print(t)
    if report.get("distributed"):
        distributed_report.print_mesh_tables(report, console)
    if report.get("peer"):
        p = Table(title="Hidden states against a peer (same weights and tokens, dropout off)")
        for col in PEER_COLUMNS:
            p.add_column(col)
        for row in report["peer"]:
            p.add_row(*map(Text, peer_row(row)), style="red" if row["ok"] is False else None)
        console.print(p)
    if report["cross_framework"]:
        x = Table(title="JAX vs PyTorch (same weights and tokens)")
        for col in CROSS_COLUMNS:
            x.add_column(col)
        for row in report["cross_framework"]:
            x.add_row(*map(Text, cross_row(row)), style=None if row["ok"] else "red")
        console.print(x)
    for c in report["cases"]:
        if c["status"] == "error":
            console.print(Text.assemble(("error", "bold red"),
                                        f" {case_label(c)}: {c['error']}"))
        if c["status"] == "no_saving":
            console.print(Text(f"no saving: {no_saving_line(c)}", style="red"))


def case_label(c: dict) -> str:
    """A case's name in one line: ``framework/mode dtype [dropout p] schedule`` (dropout only where on)."""
    drop = f" dropout {c['dropout']:g}" if c.get("dropout") else ""
    return f"{c['framework']}/{c['mode']} {c['dtype']}{drop} {_schedule_label(c)}"


def no_saving_line(c: dict) -> str:
    """One line for a ``no_saving`` case: which plan, its measured peak activation ratio, and why."""
    sv = c.get("saving") or {}
    ratio = sv.get("peak_activation_ratio")
    return (f"{case_label(c)}: peak activation "
            f"{'?' if ratio is None else f'{ratio:.2f}'} x none's; {sv.get('cause')}")


def _md_table(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """The report as Markdown: settings, the case table, the cross-framework table, errors."""
    cfg = report.get("config") or {}
    pairs = cfg.get("arch") in registered_models() and get_model(cfg["arch"]).batch == "sentence_pairs"
    data = (f"{report['batch_size']} sentences ({report['batch_size'] // 2} paraphrase pairs, contrastive loss) x "
            f"{report['seq_len']} tokens of the bundled sentence set, tokenized with the checkpoint's tokenizer.json"
            if pairs else
            f"{report['batch_size']} x {report['seq_len']} byte tokens of the bundled public-domain corpus")
    parts = [
        f"# Parity report: {report['model']} ({report['suite']} suite)",
        "",
        verdict(report),
        "",
        f"Model: {cfg.get('n_layer')} layers, d_model {cfg.get('d_model')}, {cfg.get('n_head')} heads, "
        f"d_ff {cfg.get('d_ff')}; batch {data}; AdamW {report['hparams']['steps']} steps "
        f"(lr {report['hparams']['learning_rate']:g}); seed {report['seed']}.",
        "",
    ]
    if report["cases"] or not report.get("distributed"):  # the case table and its legend
        parts += [
            "Each case compares one schedule with `none` in the same framework and mode, byte for byte "
            "(the `none` row compares two runs of itself). `saved` = activation bytes kept for the backward "
            "pass in device memory (parameters excluded); `offloaded` = bytes a policy moved to host memory "
            "instead; `saved pred` = the per-layer model's prediction of `saved`, as a relative gap "
            "(`!` above 10%); `peak act` = measured peak less parameters, gradients and optimizer state, "
            "`peak act pred` its prediction's gap; `peak act/none` the measured peak activation over `none`'s "
            "(`NO`: the plan promises a saving, keeping fewer activations, and does not realize it: status `no_saving`); `names as declared` = one checkpointed block keeps exactly the activation names its "
            "policy declares (see below); `peak` = peak bytes of one training step (source per case in "
            "report.json); `units/none` = the chain model's peak units (segments + longest segment) over "
            "`none`'s; `time/none` = median step time over `none`'s; `time/none range` = the lowest and highest "
            "ratio any pair of timed steps gives (min over `none`'s max to max over `none`'s min): a range that "
            "holds 1.00 is noise at these repeats. Machine and library versions: `environment` in report.json.",
            "", _md_table(*case_table(report)), ""]
    if report.get("distributed"):
        parts += distributed_report.markdown_sections(report)
    if report.get("peer"):
        parts += ["## Hidden states against a peer", "", _md_table(PEER_COLUMNS, [peer_row(x) for x in report["peer"]]), ""]
    if report["cross_framework"]:
        parts += ["## JAX vs PyTorch", "", _md_table(CROSS_COLUMNS, [cross_row(x) for x in report["cross_framework"]]), ""]
        seen = {}
        for x in report["cross_framework"]:
            if x.get("tolerance_loss_reason"):
                seen[f"{x['dtype']} loss"] = x["tolerance_loss_reason"]
            seen[f"{x['dtype']} grads"] = x["tolerance_reason"]
        parts += [f"- **{d}**: {r}" for d, r in seen.items()] + [""]
    kept_rows, seen_policies = [], set()
    for c in report["cases"]:
        for policy, names, ok in _block_name_entries(c):
            if (c["framework"], policy) in seen_policies:
                continue
            seen_policies.add((c["framework"], policy))
            shapes = ", ".join(f"{t['name']} {tuple(t['shape'])}{' (host)' if t['memory'] == 'host' else ''}"
                               for t in names["tensors"])
            kept_rows.append([policy, c["framework"], _bit(ok), shapes or "nothing"])
    if kept_rows:
        parts += ["## What one checkpointed block keeps, per policy", "",
                  "Measured on one block (JAX: saved residuals with their `checkpoint_name` tags; PyTorch: the "
                  "op outputs the selective checkpoint caches, by activation region). JAX drops `mlp_out`, "
                  "which nothing in the block's backward reads; PyTorch keeps what the policy names "
                  "(docs/policies.md).", "",
                  _md_table(("policy", "framework", "as declared", "kept tensors"), sorted(kept_rows)), ""]
    flagged = [c for c in report["cases"] if c.get("prediction_flags")]
    if flagged:
        parts += ["## Predictions more than 10% off the measurement", "",
                  "The per-layer model (docs/memory-model.md) predicted these numbers more than 10% away from "
                  "what was measured; the model leaves out single-op working buffers and allocator behaviour.", ""]
        parts += [f"- {c['framework']}/{c['mode']} {c['dtype']} {c['schedule']}: {'; '.join(c['prediction_flags'])}"
                  for c in flagged] + [""]
    unsaved = [c for c in report["cases"] if c["status"] == "no_saving"]
    if unsaved:
        parts += ["## Plans that did not save memory", "",
                  "These plans keep fewer activations than `none` but their measured peak activation is not "
                  "below `none`'s (status `no_saving`; the run exits 1):", ""]
        parts += [f"- {no_saving_line(c)}" for c in unsaved] + [""]
    errors = [c for c in report["cases"] if c["status"] == "error"]
    if errors:
        parts += ["## Errors", ""] + [f"- {case_label(c)}: `{c['error']}`" for c in errors] + [""]
    fails = [c for c in report["cases"] if c["status"] == "fail"]
    if fails:
        parts += ["## Failed checks", ""] + [
            f"- {case_label(c)}: max ULP {c['max_ulp']}, "
            f"max abs diff {(c['max_abs_diff'] or 0.0):.3e}, differing: {', '.join(c['mismatched']) or 'trained weights/reverse loop'}"
            for c in fails
        ] + [""]
    return "\n".join(parts)


def write_report(report: dict, out: Path) -> list[Path]:
    """Write ``report.json`` (strict JSON) and ``report.md`` into ``out`` atomically, and for a complete
    report ``report.html`` (:mod:`parity.report.html`); return their paths. A partial report
    (``"complete": false``) removes a ``report.html`` left there, so the page never shows another run.

    Raises:
        parity.report.files.WriteError: a file could not be written (disk full, ``ulimit -f``); the file
            already there is kept whole.
    """
    paths = [out / "report.json", out / "report.md"]
    atomic_write(paths[0], json_text({**report, "nonfinite_encoding": NONFINITE_ENCODING}))
    atomic_write(paths[1], markdown(report))
    if report.get("complete") is False:
        (out / HTML_NAME).unlink(missing_ok=True)
        return paths
    return [*paths, write_html(report, out)]

"""Writing the parity report: ``report.json``, ``report.md``, ``report.html`` and a terminal table (rich).

Files are written atomically (:mod:`parity.report.files`: temporary file, ``fsync``, ``os.replace``), so
an interrupted run or a full disk never leaves a half-written report; ``report.json`` is strict
JSON (non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"``; ``"nonfinite_encoding":
"string"`` says so). A previous report in the output directory is kept: it is moved to
``previous/<UTC timestamp>/`` unless ``overwrite`` is set. Everything printed is plain text,
never console markup (a ``[name]`` in a value is printed as it is).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.text import Text

from jaxremat.models import get_model, registered_models

from parity.checks.predictions import GAP_LIMIT
from parity.report.files import NONFINITE_ENCODING, atomic_write, json_text
from parity.report.format import fmt_bit, fmt_bytes, fmt_gap, fmt_range, fmt_ratio, fmt_time_ratio, md_table
from parity.report.html import HTML_NAME, write_html
from parity.report.terminal import fitted_table, name_table, terminal_console

from parity.checks.verdict import report_passed
from parity.report import distributed_report
from parity.report.peer_report import peer_step_markdown, print_peer_steps

REPORT_FILES = ("report.json", "report.md", HTML_NAME)

SCHEMA_VERSION = 6
"""report.json schema: 6 starts every case with the same fields (:data:`parity.cases.record.BASE_FIELDS`:
the plan's name is ``plan``, no longer ``schedule``, in cases, cross-framework rows and distributed rows;
budget cases are ``budget(50%)``); 5 lets a segment plan's case list its policies (``policy`` joined by ``,``;
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
    """Keep a previous report (``files``) in ``out``, a folder :func:`writable_dir` checked; return a message
    about what was kept. With ``overwrite`` nothing is kept: the report's files are rewritten by the new
    run, and a folder among ``files`` (a name ending in ``/``: the distributed suite's ``distributed/``) is removed first, with the
    previous report's files that point into it, but only when the folder carries :data:`SUITE_MARKER`
    (the suite wrote it).

    Raises:
        OutputDirError: ``out`` exists and is not a directory, or cannot be written; with ``overwrite``, a
            folder name among ``files`` is taken by something the suite did not write (a file, a link,
            a folder without the marker), or cannot be removed, or a file name among them is a folder.
    """
    existing = [f for f in files if (out / f).exists() or (out / f).is_symlink()]
    folders = [f for f in files if f.endswith("/")]  # the suite's folders ("distributed/"); the rest are files
    if overwrite:  # a folder of the previous report goes whole (its files would mix with the new run's)
        for f in existing:  # a report file's name taken by a folder: refused here, before any work
            if f not in folders and (out / f).is_dir():
                raise OutputDirError(f"{out / f} is a folder where this command writes its file {f}; --overwrite "
                                     "replaces files only: move the folder away or pass another --out")
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


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of the case table: its header, the case field it shows, how, and what it means.

    Attributes:
        header: the column's title.
        key: the case field shown (``case.get(key)``), or a function of the whole case.
        fmt: value -> display string.
        doc: one sentence for the legend of report.md (empty: the column needs none).
        left: left-aligned in the terminal (text columns); numbers are right-aligned.
    """

    header: str
    key: str | Callable[[dict], object]
    fmt: Callable[[object], str] = str
    doc: str = ""
    left: bool = False

    def cell(self, case: dict) -> str:
        """The column's display string for ``case``."""
        return self.fmt(self.key(case) if callable(self.key) else case.get(self.key))


def _gap(g) -> str:
    return fmt_gap(g, GAP_LIMIT)


def _saving(sv: dict | None) -> str:
    """Measured peak activation over none's; ' NO' when a promised saving is not realized."""
    if not sv or sv.get("peak_activation_ratio") is None:
        return "-"
    return f"{sv['peak_activation_ratio']:.2f}" + (" NO" if sv.get("realized") is False else "")


def _plan_label(c: dict) -> str:
    return c["plan"] if not c.get("variant") else f"{c['variant']}: {c['plan']}"


def _ms(t) -> str:
    return "-" if t is None else f"{1e3 * t:.1f}"


CASE_COLUMNS: tuple[Column, ...] = (
    Column("framework", "framework", left=True),
    Column("mode", "mode", left=True),
    Column("dtype", "dtype", left=True),
    Column("plan", _plan_label, left=True),
    Column("status", "status", left=True),
    Column("grads bitwise", "grads_bitwise_equal", fmt_bit,
           "the loss and every parameter gradient have the same raw bytes as under `none` in the same framework and "
           "mode (the `none` row compares two runs of itself: determinism)"),
    Column("weights bitwise", "weights_bitwise_equal", fmt_bit, "so do the weights after the optimizer steps"),
    Column("reverse loop", "reverse_loop_bitwise_equal", fmt_bit,
           "an independent hand-rolled reverse segment loop gives the same gradient bytes"),
    Column("max ULP", "max_ulp", lambda v: "-" if v is None else str(v),
           "where bytes differ, the largest distance in units in the last place"),
    Column("names as declared", "names_ok", fmt_bit,
           "one checkpointed block keeps exactly the activation names its policy declares (see below)"),
    Column("saved", "saved_bytes", fmt_bytes,
           "activation bytes kept for the backward pass in device memory (parameters excluded)"),
    Column("saved/none", "saved_ratio", fmt_ratio),
    Column("saved pred", "saved_gap", _gap,
           f"the per-layer model's prediction of `saved`, as a relative gap (`!` above {GAP_LIMIT:.0%})"),
    Column("offloaded", "offloaded_bytes", lambda v: "-" if not v else fmt_bytes(v),
           "bytes a policy moved to host memory instead"),
    Column("peak", "peak_bytes", fmt_bytes, "peak bytes of one training step (source per case in report.json)"),
    Column("peak/none", "peak_ratio", fmt_ratio),
    Column("peak act", "peak_activation_bytes", fmt_bytes,
           "measured peak less parameters, gradients and optimizer state"),
    Column("peak act pred", "peak_gap", _gap, "its prediction's gap"),
    Column("peak act/none", "saving", _saving,
           "the measured peak activation over `none`'s (`NO`: the plan promises a saving, keeping fewer "
           "activations, and does not realize it: status `no_saving`)"),
    Column("units/none", "predicted_unit_ratio", fmt_ratio,
           "the chain model's peak units (segments + longest segment) over `none`'s"),
    Column("recomputed", "recomputed_blocks", str, "block forwards recomputed per step"),
    Column("step ms", "step_time_s", _ms),
    Column("time/none", lambda c: _time(c, with_range=False), str,
           "median step time over `none`'s; `noise` where its range is wider than its distance from 1"),
    Column("time/none range", "time_overhead_range", fmt_range,
           "the lowest and highest ratio any pair of timed steps gives (min over `none`'s max to max over `none`'s "
           "min): a range wider than the ratio's distance from 1.00 is noise at these repeats"),
)
"""The case table of report.md and the terminal, one :class:`Column` per column (docs/extending.md: adding one)."""

DROPOUT_COLUMN = Column("dropout", "dropout", lambda v: f"{v or 0.0:g}", left=True)
"""Added after ``dtype`` when some case runs dropout."""


def _bitwise(c: dict) -> str:
    """Gradients and trained weights against ``none``: ``yes``, ``NO`` (with the largest ULP distance) or ``-``."""
    bits = [c.get("grads_bitwise_equal"), c.get("weights_bitwise_equal")]
    if all(b is None for b in bits):
        return "-"
    if all(b is not False for b in bits):
        return "yes"
    ulps = [u for u, equal in ((c.get("max_ulp"), bits[0]), (c.get("weights_max_ulp"), bits[1]))
            if u is not None and equal is False]
    return "NO" + (f" {max(ulps)} ULP" if ulps else "")


def _differing(c: dict) -> str:
    """What a failed case's checks found apart from ``none``'s: the loss, the gradient tensors, the trained
    weights and the reverse loop's gradients, each with its largest ULP distance (only the checks that ran)."""
    parts = ["loss"] if c.get("loss_bitwise_equal") is False else []
    if c.get("grads_bitwise_equal") is False:
        parts.append(f"gradients {', '.join(c['mismatched']) or '(names not recorded)'} ({c['max_ulp']} ULP, "
                     f"max abs diff {(c['max_abs_diff'] or 0.0):.3e})")
    if c.get("weights_bitwise_equal") is False:
        parts.append(f"trained weights ({c.get('weights_max_ulp')} ULP{_divergence(c.get('training_divergence'))})")
    if c.get("reverse_loop_bitwise_equal") is False:
        parts.append(f"reverse loop gradients ({c.get('reverse_loop_max_ulp')} ULP)")
    return "; ".join(parts) or "no bitwise check differs (see the case's other fields)"


def _divergence(d: dict | None) -> str:
    """``; first apart at training step k's gradients; intra-op threads 2 and 1`` from a case's
    ``training_divergence`` (:func:`parity.runners.result.training_divergence`); empty when not recorded."""
    if not d:
        return ""
    what = "gradients" if d["first"] == "gradients" else "update, gradients equal"
    threads = d.get("threads") or [None, None]
    told = f"; intra-op threads {threads[0]} and {threads[1]}" if None not in threads else ""
    return f"; first apart at training step {d['step']}'s {what}{told}"


def _time(c: dict, with_range: bool = True) -> str:
    """Step time over ``none``'s with its range; ``noise (...)`` where the range is wider than the distance from 1
    (:func:`parity.report.format.fmt_time_ratio`; ``with_range=False``: ``1.27`` or ``noise``, for a table with a
    range column of its own); ``none``'s own row shows its range only."""
    t, r = c.get("time_overhead"), c.get("time_overhead_range")
    if t is None:
        return "-"
    if c.get("plan") == "none":
        return f"{t:.2f}" + (f" [{r[0]:.2f}-{r[1]:.2f}]" if r and with_range else "")
    return fmt_time_ratio(t, r, with_range)


TERMINAL_COLUMNS: tuple[Column, ...] = (
    Column("fw", "framework", left=True),
    Column("mode", "mode", left=True),
    Column("plan", _plan_label, left=True),
    Column("status", "status", left=True),
    Column("bitwise", _bitwise),
    Column("act/none", "saving", _saving),
    Column("time/none [range]", _time),
)
"""The terminal's case table (``--wide``: :data:`CASE_COLUMNS`): framework, mode, plan, status, gradients and
weights bitwise, measured peak activation over ``none``'s, step time over ``none``'s with its range."""


def legend(columns) -> str:
    """The case table's legend: what a case compares, then each documented column's ``doc``."""
    docs = "; ".join(f"`{c.header}` = {c.doc}" for c in columns if c.doc)
    return ("Each case compares one plan with `none` in the same framework and mode, byte for byte: " + docs
            + ". Machine and library versions: `environment` in report.json.")


def case_row(c: dict) -> list[str]:
    """One report case as display strings, in :data:`CASE_COLUMNS` order."""
    return [col.cell(c) for col in CASE_COLUMNS]


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
    timed = [c for c in cases if c.get("time_overhead_range") and c["plan"] != "none"]
    if timed:
        resolved = sum(fmt_time_ratio(c["time_overhead"], c["time_overhead_range"], False) != "noise" for c in timed)
        rest = len(timed) - resolved
        parts.append(f"timing: {resolved} of {len(timed)} time/none ratios lie farther from 1 than their range is wide"
                     + (f" (the other {rest} {'is' if rest == 1 else 'are'} noise at these repeats)" if rest else ""))
    return f"**Verdict: {head}** - " + "; ".join(parts) + "."


def case_columns(report: dict) -> tuple[Column, ...]:
    """The case table's columns: :data:`CASE_COLUMNS`, with :data:`DROPOUT_COLUMN` after ``dtype`` when some case has dropout."""
    if not any(c.get("dropout") for c in report["cases"]):
        return CASE_COLUMNS
    i = [c.header for c in CASE_COLUMNS].index("dtype") + 1
    return CASE_COLUMNS[:i] + (DROPOUT_COLUMN,) + CASE_COLUMNS[i:]


def case_table(report: dict) -> tuple[tuple[str, ...], list[list[str]]]:
    """Headers and rows of the case table (:func:`case_columns`)."""
    columns = case_columns(report)
    return tuple(c.header for c in columns), [[col.cell(c) for col in columns] for c in report["cases"]]


PEER_COLUMNS = ("check", "dtype", "max rel err", "tolerance", "ok", "note")


_PRETRAINED = re.compile(r"from_pretrained\((/[^)]*)\)")


def peer_row(x: dict, short: bool = False) -> list[str]:
    """One peer comparison (:mod:`parity.checks.peer`) as display strings, in :data:`PEER_COLUMNS` order.

    ``short``: the checkpoint's path in the note by its last two folders (``from_pretrained of .../pkg/model``: words
    a narrow column can break between), for the terminal; report.md keeps it whole."""
    err = "-" if x["max_rel_err"] is None else f"{x['max_rel_err']:.2e}"
    tol = "-" if x["tolerance"] is None else f"{x['tolerance']:.0e}"
    ok = {True: "yes", False: "NO", None: "skipped"}[x["ok"]]
    note = x["note"]
    if short:
        note = _PRETRAINED.sub(lambda m: f"from_pretrained of .../{'/'.join(Path(m.group(1)).parts[-2:])}", note)
    return [x["check"], x["dtype"], err, tol, ok, note]


CROSS_COLUMNS = ("dtype", "plan", "loss err", "loss tol", "grads err", "grads tol", "ok")


def cross_row(x: dict) -> list[str]:
    """One cross-framework comparison as display strings, in :data:`CROSS_COLUMNS` order.

    ``loss err`` is the loss difference over the loss's term scale (:func:`parity.checks.compare.cross_row`).
    """
    f = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
    return [x["dtype"], _plan_label(x), f(x["loss_err"]), f(x["tolerance_loss"]), f(x.get("max_rel_err_grads")),
            f(x.get("tolerance")), "yes" if x["ok"] else "NO"]


def terminal_columns(report: dict) -> tuple[Column, ...]:
    """:data:`TERMINAL_COLUMNS`, with ``dtype`` (several dtypes) and ``dropout`` (some case runs it) after ``mode``."""
    extra = tuple(col for col, on in ((Column("dtype", "dtype", left=True), len({c["dtype"] for c in report["cases"]}) > 1),
                                      (DROPOUT_COLUMN, any(c.get("dropout") for c in report["cases"]))) if on)
    return TERMINAL_COLUMNS[:2] + extra + TERMINAL_COLUMNS[2:]


_STYLE = {"pass": None, "fail": "red", "no_saving": "red", "over_budget": "red", "error": "bold red"}


def print_tables(report: dict, console: Console | None = None, wide: bool = False) -> None:
    """Print the verdict, then the case table (compact: :func:`terminal_columns`; ``wide``: every column), the
    peer and cross-framework tables, and each error and no-saving case in a line, within the terminal's width
    (:mod:`parity.report.terminal`)."""
    console = console or terminal_console(wide)
    console.print(Text(verdict(report).replace("**", "")))
    if report.get("distributed") and not report["cases"]:
        distributed_report.print_mesh_tables(report, console, wide)
        return
    columns = case_columns(report) if wide else terminal_columns(report)
    headers = [c.header for c in columns]
    console.print(name_table(console, f"parity: {report['model']} ({report['suite']} suite)", headers,
                             [[col.cell(c) for col in columns] for c in report["cases"]],
                             [i for i, h in enumerate(headers) if h == "plan"],  # broken after + or , only
                             left=[c.left for c in columns], styles=[_STYLE.get(c["status"]) for c in report["cases"]]))
    if not wide:
        console.print(Text("every column: --wide, report.md and report.html"))
    if report.get("distributed"):
        distributed_report.print_mesh_tables(report, console, wide)
    if report.get("peer"):
        console.print(fitted_table("Hidden states against a peer (same weights and tokens, dropout off)", PEER_COLUMNS,
                                   (peer_row(x, short=True) for x in report["peer"]),
                                   left=[True, True, False, False, False, True],
                                   styles=["red" if r["ok"] is False else None for r in report["peer"]]))
    print_peer_steps(report, console)
    if report["cross_framework"]:
        console.print(fitted_table("JAX vs PyTorch (same weights and tokens)", CROSS_COLUMNS,
                                   map(cross_row, report["cross_framework"]), left=[True, True],
                                   styles=[None if r["ok"] else "red" for r in report["cross_framework"]]))
    for c in report["cases"]:
        if c["status"] == "error":
            console.print(Text.assemble(("error", "bold red"),
                                        f" {case_label(c)}: {c['error']}"))
        if c["status"] == "no_saving":
            console.print(Text(f"no saving: {no_saving_line(c)}", style="red"))


def case_label(c: dict) -> str:
    """A case's name in one line: ``framework/mode dtype [dropout p] plan`` (dropout only where on)."""
    drop = f" dropout {c['dropout']:g}" if c.get("dropout") else ""
    return f"{c['framework']}/{c['mode']} {c['dtype']}{drop} {_plan_label(c)}"


def no_saving_line(c: dict) -> str:
    """One line for a ``no_saving`` case: which plan, its measured peak activation ratio, and why."""
    sv = c.get("saving") or {}
    ratio = sv.get("peak_activation_ratio")
    return (f"{case_label(c)}: peak activation "
            f"{'?' if ratio is None else f'{ratio:.2f}'} x none's; {sv.get('cause')}")


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
            legend(case_columns(report)),
            "", md_table(*case_table(report)), ""]
    if report.get("distributed"):
        parts += distributed_report.markdown_sections(report)
    if report.get("peer"):
        parts += ["## Hidden states against a peer", "", md_table(PEER_COLUMNS, [peer_row(x) for x in report["peer"]]), ""]
    parts += peer_step_markdown(report)
    if report["cross_framework"]:
        parts += ["## JAX vs PyTorch", "", md_table(CROSS_COLUMNS, [cross_row(x) for x in report["cross_framework"]]), ""]
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
            kept_rows.append([policy, c["framework"], fmt_bit(ok), shapes or "nothing"])
    if kept_rows:
        parts += ["## What one checkpointed block keeps, per policy", "",
                  "Measured on one block (JAX: saved residuals with their `checkpoint_name` tags; PyTorch: the "
                  "op outputs the selective checkpoint caches, by activation region). JAX drops `mlp_out`, "
                  "which nothing in the block's backward reads; PyTorch keeps what the policy names "
                  "(docs/policies.md).", "",
                  md_table(("policy", "framework", "as declared", "kept tensors"), sorted(kept_rows)), ""]
    flagged = [c for c in report["cases"] if c.get("prediction_flags")]
    if flagged:
        parts += ["## Predictions more than 10% off the measurement", "",
                  "The per-layer model (docs/memory-model.md) predicted these numbers more than 10% away from "
                  "what was measured; the model leaves out single-op working buffers and allocator behaviour.", ""]
        parts += [f"- {case_label(c)}: {'; '.join(c['prediction_flags'])}"
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
            f"- {case_label(c)}: differing from {'a second run of ' if c['plan'] == 'none' else ''}none: "
            f"{_differing(c)}" for c in fails
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

"""report.html: the page's numbers equal the Python model's, in headless Chromium, with no network.

The reports under tests/parity/data/ are real outputs, trimmed (environment and long texts dropped):
``report_gpt_tiny.json`` of ``python -m parity run --model gpt-tiny`` (N=4, batch 2 x 16 tokens),
``sweep_tiny.json`` of ``python -m parity sweep --depths 1,2 --schedules full --frameworks torch
--frontier-depth 2 --repeats 1``, ``plan_frontier.json`` of ``python -m parity plan --frontier``
(gpt-small). The browser tests skip when Chromium (the Debian ``chromium`` package) or Playwright
for Python is missing; .ci/run installs both.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from jaxremat.models.config import TransformerConfig
from parity.report import browser
from parity.report import html as report_html
from parity.report.html import HTML_NAME, page_data, write_html
from parity.report.html_model import block_forward_flops, python_prediction
from parity.report.suite_report import write_report

DATA = Path(__file__).parent / "data"
NO_BROWSER = browser.missing()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=f"no headless browser: {NO_BROWSER}")


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


REPORT = _load("report_gpt_tiny.json")
CFG = TransformerConfig(**REPORT["config"])


def test_write_report_writes_the_page_for_a_complete_report_only(tmp_path):
    paths = write_report({**REPORT, "complete": True}, tmp_path)
    page = (tmp_path / HTML_NAME).read_text()
    assert paths[-1] == tmp_path / HTML_NAME
    assert "<script src" not in page and "cdn" not in page.lower().split("<script>", 1)[0]
    data = page_data(REPORT)
    assert data["model"]["config"]["d_model"] == CFG.d_model
    assert len(data["points"]) == sum(c["status"] != "error" for c in REPORT["cases"]) == 12
    assert write_report({**REPORT, "complete": False}, tmp_path) == paths[:2]
    assert not (tmp_path / HTML_NAME).exists()  # a partial report never sits beside another run's page


def test_block_forward_flops_equal_torch_flop_counter():
    from torchref.planner import gpt_block_options

    cfg = TransformerConfig(vocab_size=64, n_layer=2, d_model=16, n_head=4, d_ff=48, max_seq_len=16)
    ckpt = [o for o in gpt_block_options(cfg, 3, 12, ("save_nothing",)) if o.checkpointed]
    assert [o.recompute_flops for o in ckpt] == [block_forward_flops(cfg, 3, 12)] == [211968]


@pytest.fixture(scope="module")
def chromium():
    with browser.chromium() as b:
        yield b


@pytest.fixture(scope="module")
def tiny_page(tmp_path_factory, chromium):
    out = tmp_path_factory.mktemp("html")
    write_html(REPORT, out)
    page, log = browser.open_page(chromium, out / HTML_NAME)
    yield page, log
    page.close()


def _set(page, setting: dict) -> dict:
    """Move the controls to ``setting`` as a user does (select / drag, each firing ``input``) and read the numbers."""
    for key in ("framework", "batch", "seq", "policy", "kind"):
        page.select_option(f"#{key}", str(setting[key]))
    for key in ("n_layer", "param"):
        page.eval_on_selector("#n" if key == "n_layer" else "#param",
                              "(e, v) => { e.value = v; e.dispatchEvent(new Event('input')); }", str(setting[key]))
    cells = {"saved_bytes": "pred-saved", "peak_activation_bytes": "pred-peak", "peak_units": "units",
             "recomputed_blocks": "recomputed", "recompute_flops": "flops", "measured_saved": "meas-saved",
             "measured_peak": "meas-peak"}
    shown = {k: page.get_attribute(f"#{c}", "data-value") for k, c in cells.items()}
    return {k: (int(v) if v else None) for k, v in shown.items()} | {
        "text": page.inner_text("#pred-peak"), "measured_text": page.inner_text("#meas-peak")}


SETTINGS = [
    dict(framework="jax", batch=2, seq=16, policy="save_nothing", kind="every_k", n_layer=4, param=2),
    dict(framework="torch", batch=2, seq=16, policy="save_nothing", kind="sqrt", n_layer=4, param=1),
    dict(framework="jax", batch=8, seq=64, policy="save_nothing", kind="segments", n_layer=24, param=5),
    dict(framework="torch", batch=1, seq=128, policy="save_nothing", kind="nested", n_layer=32, param=3),
    dict(framework="torch", batch=16, seq=256, policy="save_nothing", kind="none", n_layer=17, param=1),
    dict(framework="jax", batch=4, seq=32, policy="save_qkv_proj", kind="every_k", n_layer=9, param=3),
    dict(framework="jax", batch=1, seq=16, policy="save_nothing", kind="full", n_layer=1, param=1),
]


@needs_browser
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s['framework']}-{s['kind']}-N{s['n_layer']}")
def test_page_numbers_equal_the_python_model_as_the_controls_move(tiny_page, setting):
    page, log = tiny_page
    shown = _set(page, setting)
    want = python_prediction(setting["framework"], CFG, setting["batch"], setting["seq"], setting["n_layer"],
                             setting["kind"], setting["param"], setting["policy"])
    assert {k: shown[k] for k in want} == want
    if want["peak_activation_bytes"] is not None:
        assert f"{want['peak_activation_bytes']:,} B" in shown["text"]
    else:
        assert "not modelled" in shown["text"]
    assert log == {"requests": [], "errors": []}


@needs_browser
def test_page_shows_the_measured_point_beside_the_prediction(tiny_page):
    page, _ = tiny_page
    shown = _set(page, SETTINGS[0])
    case = next(c for c in REPORT["cases"] if (c["framework"], c["mode"], c["plan"]) == ("jax", "jit", "every_k(2)"))
    assert (shown["measured_saved"], shown["measured_peak"]) == (case["saved_bytes"], case["peak_activation_bytes"])
    assert "measured (jit)" in shown["measured_text"] and "measured (eager)" in shown["measured_text"]
    far = _set(page, SETTINGS[2])  # no case at N=24, batch 8
    assert far["measured_peak"] is None and "no measurement" in far["measured_text"]


@needs_browser
def test_page_model_equals_python_over_a_sample_of_the_grid(tiny_page):
    page, log = tiny_page
    rng = random.Random(0)
    model = page_data(REPORT)["model"]
    sample = []
    for _ in range(150):
        n = rng.randint(1, model["max_depth"])
        sample.append(dict(framework=rng.choice(model["frameworks"]), batch=rng.choice(model["batches"]),
                           seq=rng.choice(model["seqs"]), n_layer=n, kind=rng.choice(model["kinds"]),
                           param=rng.randint(1, n), policy=rng.choice(model["policies"])))
    got = page.evaluate("s => s.map(x => window.jaxrematModel.predict(x))", sample)
    for s, g in zip(sample, got):
        want = python_prediction(s["framework"], CFG, s["batch"], s["seq"], s["n_layer"], s["kind"], s["param"], s["policy"])
        assert {k: g[k] for k in want} == want, s
    assert log == {"requests": [], "errors": []}


@needs_browser
@pytest.mark.parametrize("name, plots", [("sweep_tiny.json", 3), ("plan_frontier.json", 4)])
def test_sweep_and_plan_pages_draw_their_views_offline(tmp_path, chromium, name, plots):
    write_html(_load(name), tmp_path)
    page, log = browser.open_page(chromium, tmp_path / HTML_NAME)
    assert page.locator("#static .plot .main-svg").count() >= plots
    assert page.locator("#live-segments .main-svg").count() >= 1
    assert log == {"requests": [], "errors": []}
    page.close()


@needs_browser
def test_a_page_that_asks_for_the_network_is_caught(tmp_path, chromium):
    (tmp_path / "p.html").write_text('<html><body><img src="http://192.0.2.1/x.png">'
                                     '<script>document.body.dataset.ready = "1"; console.error("boom")</script></body></html>')
    page, log = browser.open_page(chromium, tmp_path / "p.html")
    page.wait_for_timeout(200)
    assert log["requests"] == ["http://192.0.2.1/x.png"] and "boom" in log["errors"]
    page.close()


def test_cli_refuses_to_overwrite_a_png_without_overwrite(tmp_path, capsys, monkeypatch):
    (tmp_path / "report.json").write_text(json.dumps(REPORT))
    png = tmp_path / "view.png"
    png.write_bytes(b"mine")
    monkeypatch.setattr(report_html, "missing", lambda: None)  # the refusal must not depend on a browser here
    shots = []
    monkeypatch.setattr(report_html, "screenshot", lambda page, out: shots.append(out) or out.write_bytes(b"new"))
    rc = report_html.main([str(tmp_path), "--screenshot", str(png)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "exists; pass --overwrite to replace it" in err[0]
    assert png.read_bytes() == b"mine" and not (tmp_path / HTML_NAME).exists() and not shots
    assert report_html.main([str(tmp_path), "--screenshot", str(png), "--overwrite"]) == 0
    assert png.read_bytes() == b"new" and shots == [png] and (tmp_path / HTML_NAME).is_file()


def test_cli_screenshot_without_a_browser_is_one_line_before_any_write(tmp_path, capsys, monkeypatch):
    (tmp_path / "report.json").write_text(json.dumps(REPORT))
    monkeypatch.setattr(report_html, "missing", lambda: "Chromium not found at /nowhere (apt-get install chromium)")
    rc = report_html.main([str(tmp_path), "--screenshot", str(tmp_path / "view.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "needs a headless browser: Chromium not found" in err[0]
    assert not (tmp_path / HTML_NAME).exists() and not (tmp_path / "view.png").exists()

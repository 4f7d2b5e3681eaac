"""``python -m parity run`` on segment plans (gpt-tiny, N=4): bitwise, names per policy, predictions or ``-``."""

import json

import pytest

from parity.cli.run import main

STORED_TAIL = "plan(2,2:store)"  # no policy: the activation account predicts its saved bytes
MIXED = "plan(2+save_dots,2+mlp_only)"  # a policy per segment: the account has no prediction ("-")


@pytest.fixture(scope="module")
def segment_plan_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("segment_plan_report")
    rc = main(["run", "--model", "gpt-tiny", "--schedules", f"{STORED_TAIL},{MIXED}", "--repeats", "1",
               "--no-progress", "--out", str(out)])
    return rc, json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_segment_plans_run_bitwise_with_their_policies_checked(segment_plan_report):
    rc, report, md = segment_plan_report
    cases = report["cases"]
    assert {c["schedule"] for c in cases} == {"none", STORED_TAIL, MIXED}
    for c in cases:
        assert c["grads_bitwise_equal"] is True and c["loss_bitwise_equal"] is True, c
        assert c["weights_bitwise_equal"] is (None if (c["framework"], c["mode"]) == ("jax", "eager") else True), c
        if c["schedule"] == MIXED:
            assert c["policy"] == "save_dots,mlp_only" and c["names_ok"] is True
            assert [b["policy"] for b in c["block_names"]] == ["save_dots", "mlp_only"]
            assert [e["policy"] for e in c["expected_names"]] == ["save_dots", "mlp_only"]
            assert c["predicted_saved_bytes"] is None  # the account does not model policies: "-"
            assert c["recomputed_blocks"] == 4 and c["predicted_peak_units"] == 4
        if c["schedule"] == MIXED and c["framework"] == "jax":
            # measured: on gpt-tiny a policy segment's 2-layer parameter slice and gradient slice outweigh what
            # the policies save (as for every_k(2)+save_qkv_proj in tests/parity/test_cli.py)
            assert c["status"] == "no_saving" and c["saving"]["cause"], c
        else:
            assert c["status"] == "pass", c
        if c["schedule"] == STORED_TAIL:
            assert c["policy"] == "save_nothing" and c["saved_bytes"] == c["predicted_saved_bytes"], c
    assert all(x["ok"] for x in report["cross_framework"]) and len(report["cross_framework"]) == 3
    assert rc == 1  # the JAX no_saving cases fail the run
    assert "| mlp_only | torch | yes |" in md and "| save_dots | jax | yes |" in md


def test_segment_plan_that_does_not_fit_the_model_is_refused_before_running(tmp_path, capsys):
    rc = main(["run", "--model", "gpt-tiny", "--schedules", "plan(3,3)", "--no-progress", "--out", str(tmp_path)])
    assert rc == 2
    assert "the segment lengths sum to 6 blocks but the stack has n_layer=4" in capsys.readouterr().err

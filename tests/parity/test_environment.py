"""The machine record of a report: library versions and the devices each framework computes on."""

import json
from importlib import metadata

import jax

from parity.report.environment import devices, environment_info


def test_devices_name_each_framework_device():
    expected_jax = [f"{d.platform}: {d.device_kind}" for d in jax.devices()]
    assert devices(("jax", "torch")) == {"jax": expected_jax, "torch": ["cpu"]}
    assert devices(("torch",)) == {"torch": ["cpu"]}
    assert devices(()) == {}


def test_environment_info_is_plain_json_with_versions_and_devices():
    env = environment_info(("jax",))
    assert json.loads(json.dumps(env, allow_nan=False)) == env
    assert env["versions"]["jax"] == metadata.version("jax") and env["versions"]["numpy"] == metadata.version("numpy")
    assert env["devices"]["jax"] and set(env["devices"]) == {"jax"}
    assert env["cpu_count"] >= 1 and env["python"].count(".") == 2

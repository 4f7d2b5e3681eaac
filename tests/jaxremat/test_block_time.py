"""The planner's time cost measured in JAX (jaxremat.block_time): structure, never speed."""

import math

import jax
import jax.numpy as jnp

from jaxremat.block_time import block_option_times
from jaxremat.spec.option_time import options_with_times
from jaxremat.spec.planner import BlockOption


def _block(p, h):
    return h + jnp.tanh(h @ p["w"])


def test_an_option_is_timed_on_segments_of_two_lengths():
    # one option: each is 4 compiled programs (forward and step at 2 and 4 blocks), seconds of XLA compile each
    params = {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32)}
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    times = block_option_times(_block, params, x, ["save_nothing"], rounds=2, min_sample_s=1e-4)
    assert set(times) == {"save_nothing"}
    for name, t in times.items():
        assert t.name == name and t.rounds == 2 and t.lengths == (2, 4)
        for s in (t.forward, t.backward, t.segment):
            assert s.low_s <= s.median_s <= s.high_s and all(map(math.isfinite, (s.low_s, s.high_s)))
        assert t.step_time_s >= 0 and t.segment_time_s >= 0
    menu = options_with_times([BlockOption("save_nothing", True, "save_nothing", 0, 128)], times)
    assert menu[0].step_time_s == times["save_nothing"].step_time_s

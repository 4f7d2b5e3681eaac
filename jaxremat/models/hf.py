"""Helpers shared by the families' Hugging Face checkpoint adapters (``jaxremat.models.<family>.checkpoint``).

An adapter module maps a Hugging Face ``config.json`` and its ``model.safetensors`` keys onto one
family's config and canonical layout (numpy only; :mod:`parity.inputs.checkpoints` reads and
checks the files and calls it). It defines:

* ``PREFIX``: the key prefix a task head's checkpoint adds (``"transformer."``, ``"bert."``), stripped on load;
* ``LAYER_KEY``: a compiled regex whose group 1 is the layer index of a per-layer key;
* ``IGNORED_KEYS``: ``(regex, reason)`` of keys that hold no parameter of the model;
* ``config_from_hf(hf, dtype) -> TransformerConfig`` (KeyError for a missing field, ValueError
  for an unsupported value), ``hf_config(cfg) -> dict``;
* ``hf_shapes(cfg) -> {key: shape}`` of every parameter key (no prefix);
* ``to_canonical(cfg, tensors) -> {name: array}`` from keys already checked against ``hf_shapes``
  (exact: transposes, stacking, concatenation), and its inverse ``from_canonical(cfg, params)``.
"""

from __future__ import annotations


def one_rate(hf: dict, names: tuple[str, ...], what: str) -> float:
    """The one value of the fields ``names`` of ``hf`` that are present (0.0 if none is).

    Raises:
        ValueError: the present fields differ (the model has one rate).
    """
    values = {n: hf[n] for n in names if n in hf}
    if len(set(values.values())) > 1:
        raise ValueError(f"config.json: {what} rates differ ({values}); this model has one dropout rate")
    return float(next(iter(values.values()), 0.0))

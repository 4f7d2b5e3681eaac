"""parity: the JAX/Flax vs PyTorch rematerialization harness (``python -m parity run``).

The only package where JAX and PyTorch meet: weights and tokens go through both frameworks,
each schedule is compared byte for byte with no remat inside each framework, the frameworks are
compared with each other, and memory is measured in both.
"""

"""Remat past one device: the same plans under JAX sharding and PyTorch FSDP2 (``--suite distributed``).

Each framework's cases run in worker processes (JAX needs its host-device count set before it
starts; PyTorch ranks are processes of a ``gloo`` group) and report :class:`parity.distributed.result.DistributedRow`
records; the suite compares them within each mesh, against the single-device reference, and
across frameworks.
"""

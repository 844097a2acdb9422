"""Parity: normx against other implementations, each run in its own virtualenv; normx on a device (GPU, half
precision) against normx on the CPU (``cuda_check``)."""

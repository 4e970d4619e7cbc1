"""Personalities: make SGLang take a platform's code paths on a machine that is not that platform.

"cuda" needs nothing (the virtual device is CUDA-shaped); "npu" is `harness.personalities.ascend`, installed on
the virtual device by `harness.devices.get_device("cpu").install("npu")`.
"""

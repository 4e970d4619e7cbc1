"""Personalities: make SGLang take its CUDA, NPU or out-of-tree code paths on a machine that is none of them."""

"""Encoder graphs: SGLang's ViT CUDA-graph runner on a VLM family's vision tower (`vit.py`)."""

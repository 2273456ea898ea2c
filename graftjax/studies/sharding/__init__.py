"""Tensor parallel on one host's devices: the gate, invariance, restore and a bench on a mesh."""

"""Traces of real layers: PyTorch (and Hugging Face) modules."""

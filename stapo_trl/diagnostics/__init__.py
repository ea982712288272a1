"""Seeing the spurious tokens: token traces written during training, and tools that read them."""

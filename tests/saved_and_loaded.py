"""A module through a ``torch.save`` / ``torch.load`` round trip in memory (a pickled copy), as the CPU tests of
copies take it beside ``copy.deepcopy``."""
import io

import torch


def saved_and_loaded(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)

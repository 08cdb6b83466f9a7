"""Sub-pixel decomposition of transposed convs (CPU, float64) and the batch chunking used by the fallbacks."""
import random

import torch
import torch.nn.functional as F

from fullfuse.fallback import pipeline, subpixel

_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def test_subpixel_equals_conv_transpose_on_random_problems():
    rng = random.Random(int.from_bytes(__import__("os").urandom(4), "little"))
    checked = 0
    while checked < 120:
        dims = rng.choice([1, 2, 3])
        k = [rng.randint(1, 6) for _ in range(dims)]
        s = [rng.randint(1, 4) for _ in range(dims)]
        p = [rng.randint(0, kk - 1) for kk in k]
        op = [rng.randint(0, ss - 1) for ss in s]
        size = [rng.randint(1, 7) for _ in range(dims)]
        x = torch.randn(2, 3, *size, dtype=torch.float64)
        w = torch.randn(3, 4, *k, dtype=torch.float64)
        try:
            want = _CONV_T[dims](x, w, None, s, p, op)
        except RuntimeError:        # torch rejects the combination (e.g. empty output)
            continue
        got = subpixel.conv_transpose(x, w, s, p, op)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-10), (dims, k, s, p, op, size)
        checked += 1


def test_chunks_cover_the_batch_evenly():
    assert pipeline.chunks(128, 16 << 20) == [(i * 16, i * 16 + 16) for i in range(8)]
    assert pipeline.chunks(1, 10 << 30) == [(0, 1)]
    assert pipeline.chunks(5, 1, 1 << 20) == [(0, 5)]
    spans = pipeline.chunks(7, 200 << 20)
    assert spans[0][0] == 0 and spans[-1][1] == 7 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))

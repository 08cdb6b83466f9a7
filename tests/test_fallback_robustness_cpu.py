"""The fallback's robustness on CPU (no GPU needed): cudnn_conv keeps one handle per (thread, device), copies
misaligned pointers, builds and caches nothing under capture; the pipeline times its candidates in increasing memory
order, skips the ones that do not fit and keeps the chosen one's result.  (The kernel cache's environment failures:
tests/test_kernel_cache_cpu.py; the fallback kernels' availability: tests/test_fallback_kernels_cpu.py.)
"""
import dataclasses
import threading

import pytest
import torch

from fullfuse import launch
from fullfuse.fallback import cudnn_conv, pipeline


# --- cudnn_conv ------------------------------------------------------------------------------------------------------

class FakeCudnn:
    def __init__(self):
        self.created = 0

    def create_handle(self):
        self.created += 1
        return object()


def test_cudnn_handles_are_per_thread_and_per_device(monkeypatch):
    import contextlib
    monkeypatch.setattr(cudnn_conv, "_local", threading.local())
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    cudnn = FakeCudnn()
    dev0, dev1 = torch.device("cuda", 0), torch.device("cuda", 1)
    mine = cudnn_conv.handle_for(cudnn, dev0)
    assert cudnn_conv.handle_for(cudnn, dev0) is mine and cudnn_conv.handle_for(cudnn, dev1) is not mine
    other = []
    thread = threading.Thread(target=lambda: other.append(cudnn_conv.handle_for(cudnn, dev0)))
    thread.start()
    thread.join()
    assert other[0] is not mine and cudnn.created == 3


def test_misaligned_tensors_are_copied_to_aligned_memory():
    big = torch.randn(2 * 3 * 5 * 7 + 1)
    x = big[1:].view(2, 5, 7, 3).permute(0, 3, 1, 2)          # channels_last, one element past an aligned start
    assert x.is_contiguous(memory_format=torch.channels_last) and x.data_ptr() % 16
    y = cudnn_conv.aligned(x)
    assert y.data_ptr() % 16 == 0 and y.stride() == x.stride() and torch.equal(y, x)
    z = torch.randn(4, 4)
    assert cudnn_conv.aligned(z) is z


def test_no_plan_is_built_or_cached_under_graph_capture(monkeypatch):
    monkeypatch.setattr(cudnn_conv, "frontend", lambda: object())
    monkeypatch.setattr(launch, "capturing", lambda device: True)
    monkeypatch.setattr(cudnn_conv, "_entries", {})
    built = []
    monkeypatch.setattr(cudnn_conv, "_build", lambda *a: built.append(a))
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    assert cudnn_conv.run("fprop", x, w, (2, 4, 6, 6), (0, 0), (1, 1), (1, 1), "tf32", True) is None
    assert not built and not cudnn_conv._entries


class _Chain:
    """Stands in for the frontend's graph and tensor objects: every method returns the object itself."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: self


class _FakeFrontend:
    data_type = heur_mode = build_plan_policy = numerical_note = _Chain()

    def pygraph(self, **kwargs):
        return _Chain()

    def set_stream(self, **kwargs):
        pass


@pytest.mark.parametrize("kind, x_dtype, out_dtype, plan_gpu, plan_host, torch_cost, given, frontend_serves", [
    ("fprop", torch.float32, None, 1.0, 0.1, 1.05, True, False),   # PyTorch's call within 10 %: it serves
    ("fprop", torch.float32, None, 1.0, 0.1, 1.2, True, True),     # the best plan clearly cheaper: the frontend serves
    ("fprop", torch.float32, None, 0.01, 0.1, 0.02, True, False),  # host-bound: the plan's execute costs more
    ("fprop", torch.float32, None, 0.01, 0.1, 0.2, True, True),
    ("fprop", torch.float16, torch.float32, 1.0, 0.1, 0.5, True, True),   # fp16's float32 output: only the frontend
    ("dgrad", torch.float32, None, 1.0, 0.1, 1.05, True, False),   # transposed convs: PyTorch's call compared too
    ("dgrad", torch.float32, None, 1.0, 0.1, 1.2, True, True),
    ("dgrad", torch.float32, None, 0.02, 0.12, 0.03, True, False),
    ("dgrad", torch.float32, None, 1.0, 0.1, 0.5, False, True),    # no call given: nothing to compare
])
def test_frontend_serves_only_where_its_best_plan_costs_less_than_pytorchs_call(monkeypatch, kind, x_dtype, out_dtype,
                                                                                plan_gpu, plan_host, torch_cost,
                                                                                given, frontend_serves):
    """A problem's entry: cuDNN's best plan, or TORCH_CALL (PyTorch's own call) where that costs no more per call (back
    to back: the longer of GPU and host time; the plan's call with its layout copies); decided once per problem, and
    PyTorch's call is timed on the operands as the caller has them."""
    monkeypatch.setattr(cudnn_conv, "frontend", lambda: _FakeFrontend())
    monkeypatch.setattr(cudnn_conv, "data_type", lambda cudnn, dtype: dtype)
    monkeypatch.setattr(cudnn_conv, "handle_for", lambda cudnn, device: object())
    monkeypatch.setattr(launch, "capturing", lambda device: False)
    monkeypatch.setattr(torch.cuda, "device", lambda index: __import__("contextlib").nullcontext())
    monkeypatch.setattr(launch, "device_index", lambda device: 0)
    monkeypatch.setattr(cudnn_conv, "_entries", {})
    monkeypatch.setattr(cudnn_conv, "fastest_plan", lambda *args: (3, plan_gpu, 0, 7))
    plan_cost = max(plan_gpu, plan_host)   # back to back, the longer of the two sets a call's time
    timed = []
    monkeypatch.setattr(cudnn_conv, "_costs_ms", lambda entry, call, x, w: (entry(x, w), timed.append((call, x, w)))
                        and None or (plan_cost, torch_cost))
    x, w = torch.randn(2, 3, 8, 8, dtype=x_dtype), torch.randn(4, 3, 3, 3, dtype=x_dtype)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 0})())
    call = (lambda a, b: torch.nn.functional.conv2d(a, b)) if given else None
    for _ in range(2):
        got = cudnn_conv.run(kind, x, w, (2, 4, 6, 6), (0, 0), (1, 1), (1, 1), "tf32", True, out_dtype, call)
        assert (got is cudnn_conv.TORCH_CALL) == (not frontend_serves) and got is not None
    entry, = cudnn_conv._entries.values()
    assert (entry is cudnn_conv.TORCH_CALL) == (not frontend_serves) and (not frontend_serves or entry.index == 3)
    compared = given and out_dtype is None
    assert len(timed) == (1 if compared else 0)                  # timed once per problem, never for the others
    if compared:
        assert timed[0] == (call, x, w) and timed[0][1] is x     # the caller's own operands (NCHW here)
    if frontend_serves:
        assert got.dtype == (out_dtype or x_dtype) and got.is_contiguous(memory_format=torch.channels_last)


def test_torch_serves_within_the_margin():
    assert cudnn_conv.torch_serves(1.1, 1.0) and not cudnn_conv.torch_serves(1.11, 1.0)


def test_signature_convs_look_a_problem_up_once_per_rows_and_weight_layout(monkeypatch):
    """A prepared call's convs: the problem's entry is looked up once per (rows, weight strides, weight alignment)
    and kept, except where the lookup's answer is not the problem's (a new problem under capture); TORCH_CALL and
    None are answered as they are; nothing where the frontend is switched off."""
    from fullfuse.spec import ConvActPoolSpec
    spec = ConvActPoolSpec(2, 3, 4, (3, 3), (1, 1), (0, 0), (1, 1), True, "gelu_erf", "mean", True)
    answers = {"plain": (cudnn_conv.TORCH_CALL, True), "captured": (None, False)}
    looked = []

    def lookup(kind, x, w, out_shape, *rest):
        looked.append((kind, tuple(w.stride()), out_shape))
        return answers["captured" if w.stride()[1] > w.stride()[0] else "plain"]   # (w_t below)
    monkeypatch.setattr(cudnn_conv, "lookup", lookup)
    convs = cudnn_conv.forward_convs(spec, "tf32", True, None, None, lambda rows: (rows, 4, 6, 6))
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    for _ in range(3):
        assert convs(x, w, (0, 2)) is cudnn_conv.TORCH_CALL
    assert looked == [("fprop", w.stride(), (2, 4, 6, 6))]
    assert convs(x[:1], w, (0, 1)) is cudnn_conv.TORCH_CALL and len(looked) == 2       # other rows
    w_cl = w.contiguous(memory_format=torch.channels_last)
    assert convs(x, w_cl, (0, 2)) is cudnn_conv.TORCH_CALL and len(looked) == 3        # other weight strides
    w_t = torch.randn(3, 4, 3, 3).transpose(0, 1)
    for _ in range(2):
        assert convs(x, w_t, (0, 2)) is None
    assert len(looked) == 5                                                             # not kept: asked again
    monkeypatch.setattr(cudnn_conv, "ENABLED", False)
    assert convs(x, w, (0, 2)) is None and len(looked) == 5
    assert cudnn_conv.forward_convs(dataclasses.replace(spec, groups=3), "tf32", True, None, None, None) is None


def test_transposed_convs_skip_the_frontend_where_it_never_serves():
    """No frontend for fp32 "ieee" transposed convs (cuDNN's non-tensor-core dgrad plans: ~200 ms at seed B, the
    sub-pixel forward convs ~9) nor for groups != 1; TF32 and 16-bit ones look it up."""
    from fullfuse.spec import ConvTPoolReduceSpec
    spec = ConvTPoolReduceSpec(3, 4, 6, (3, 3, 3), (2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1), False, (2, 2, 2),
                               "none", "sum", True)
    shape = lambda rows: (rows, 6, 9, 9, 9)   # noqa: E731
    assert cudnn_conv.transpose_convs(spec, torch.float32, "ieee", True, None, shape) is None
    assert cudnn_conv.transpose_convs(dataclasses.replace(spec, groups=2), torch.float32, "tf32", True, None,
                                      shape) is None
    for dtype, mode in ((torch.float32, "tf32"), (torch.bfloat16, "bfloat16")):
        convs = cudnn_conv.transpose_convs(spec, dtype, mode, True, None, shape)
        assert convs.kind == "dgrad" and convs.out_shape(2) == (2, 6, 9, 9, 9)


@pytest.mark.parametrize("answer, dtype, expect", [
    (cudnn_conv.TORCH_CALL, torch.float32, "torch, as given"),      # no layout copies where PyTorch's call serves
    (None, torch.float32, "subpixel, channels_last"),               # no plan: sub-pixel forward convs
    (None, torch.bfloat16, "torch, channels_last"),
])
def test_transposed_conv_lays_out_operands_only_for_the_conv_that_needs_them(monkeypatch, answer, dtype, expect):
    """Fallback B's transposed conv: PyTorch's call, where it serves, gets the caller's own tensors (it was timed on
    them); the sub-pixel convs and the no-plan PyTorch call get channels_last_3d copies.  The results are the conv."""
    import torch.nn.functional as F
    from fullfuse.fallback import convt_pool_reduce as fb
    from fullfuse.fallback import subpixel, torch_conv
    from fullfuse.spec import ConvTPoolReduceSpec
    spec = ConvTPoolReduceSpec(3, 4, 6, (3, 3, 3), (2, 2, 2), (1, 1, 1), (0, 0, 0), (1, 1, 1), False, (2, 2, 2),
                               "none", "sum", True)
    x = torch.randn(2, 4, 5, 5, 5).to(dtype)
    w = torch.randn(4, 6, 3, 3, 3).to(dtype)
    monkeypatch.setattr(cudnn_conv, "transpose_convs", lambda *args: lambda *call: answer)
    monkeypatch.setattr(torch_conv, "_direct_ok", lambda image_in, image_out: False)   # CPU tensors: F.convNd
    seen = []
    conv_t, sub = torch_conv.CONV_T[3], subpixel.conv_transpose
    monkeypatch.setitem(torch_conv.CONV_T, 3, lambda a, b, *rest: seen.append(("torch", a, b)) or conv_t(a, b, *rest))
    monkeypatch.setattr(subpixel, "conv_transpose", lambda a, b, *rest: seen.append(("subpixel", a, b)) or sub(a, b,
                                                                                                            *rest))
    y = fb.transposed_conv(spec, x, w, "tf32")
    (kind, a, b), = seen
    cl = torch.channels_last_3d
    if expect == "torch, as given":
        assert kind == "torch" and a is x and b is w
    else:
        assert kind == expect.split(",")[0] and a.is_contiguous(memory_format=cl) and b.is_contiguous(memory_format=cl)
    want = F.conv_transpose3d(x.double(), w.double(), None, 2, 1, 0)
    assert torch.allclose(y.double(), want, rtol=2e-2 if dtype != torch.float32 else 1e-4, atol=1e-1)


# --- pipeline --------------------------------------------------------------------------------------------------------

def test_autotune_times_in_memory_order_skips_what_does_not_fit_and_keeps_the_chosen_result(monkeypatch):
    mb = 1 << 20
    per_image, n = 4 * mb, 64                                  # whole conv output 256 MB
    monkeypatch.setattr(pipeline, "CANDIDATES", ((8 * mb, False), (32 * mb, True), (1 << 62, False)))
    monkeypatch.setattr(pipeline, "_free_bytes", lambda device: 100 * mb)   # the whole batch does not fit
    timings = {8: 1.0, 64: 0.5}                                # ms by the schedule's peak in MB
    executed = []
    monkeypatch.setattr(pipeline, "_execute", lambda device, spans, overlap, produce, consume: executed.append(
        pipeline.peak_bytes(spans, overlap, per_image) // mb))
    monkeypatch.setattr(pipeline, "_time", lambda device, fn: (fn(), timings[executed[-1]])[1])
    chunk_bytes, overlap, ms = pipeline._autotune(None, n, per_image, lambda a, b: None, lambda y, a, b: None)
    assert executed == [8, 64]              # increasing memory; the 256 MB whole batch > 0.8 * 100 MB is not run
    assert (chunk_bytes, overlap, ms) == (32 * mb, True, 0.5)


def test_autotune_prefers_less_memory_among_the_near_fastest(monkeypatch):
    mb = 1 << 20
    monkeypatch.setattr(pipeline, "CANDIDATES", ((8 * mb, False), (32 * mb, False)))
    monkeypatch.setattr(pipeline, "_free_bytes", lambda device: 1 << 40)
    runs = []
    monkeypatch.setattr(pipeline, "_execute", lambda device, spans, overlap, p, c: runs.append(len(spans)))
    monkeypatch.setattr(pipeline, "_time", lambda device, fn: (fn(), {8: 1.00, 2: 0.99}[runs[-1]])[1])
    # 64 MB of conv output: 8 chunks or 2 chunks
    chunk_bytes, overlap, _ = pipeline._autotune(None, 64, 1 * mb, lambda a, b: None, lambda y, a, b: None)
    assert chunk_bytes == 8 * mb and not overlap                 # 1 % slower, a quarter of the memory
    assert runs == [8, 2, 8]                                     # ... and its result is the one kept


def test_peak_bytes_of_a_schedule():
    assert pipeline.peak_bytes([(0, 3), (3, 6)], True, 10) == 60
    assert pipeline.peak_bytes([(0, 3), (3, 5)], False, 10) == 30
    assert pipeline.peak_bytes([(0, 6)], True, 10) == 60


def test_chunk_rows_are_the_tensor_itself_for_the_whole_batch():
    """One chunk (small batches): the conv and the epilogue get the caller's tensors, not views (host time);
    a chunk of a larger batch is the slice."""
    t = torch.arange(12.0).view(4, 3)
    assert pipeline.rows(t, 0, 4) is t
    part = pipeline.rows(t, 1, 3)
    assert part is not t and torch.equal(part, t[1:3]) and part.data_ptr() == t[1:].data_ptr()


@pytest.mark.parametrize("chosen_chunk_mb, whole", [(None, False), (8, False), (64, True)])
def test_schedule_runs_whole_batches_without_the_pipeline(chosen_chunk_mb, whole, monkeypatch):
    """A batch of one is whole from the start; a larger batch only once its first call chose a one-chunk schedule (a
    call under capture chooses nothing: it stays chunked by the default schedule)."""
    mb = 1 << 20
    monkeypatch.setattr(pipeline, "_chosen", {})
    monkeypatch.setattr(pipeline, "_execute", lambda *args: None)
    choose = {} if chosen_chunk_mb is None else {"key": (chosen_chunk_mb * mb, False, 1.0)}
    monkeypatch.setattr(pipeline, "run", lambda *args: pipeline._chosen.update(choose))
    assert pipeline.Schedule(None, "one", 1, 64 * mb).whole
    schedule = pipeline.Schedule(None, "key", 4, 16 * mb)            # 64 MB of conv output in all
    assert not schedule.whole
    schedule.run(lambda n0, n1: None, lambda y, n0, n1: None)
    assert schedule.whole == whole

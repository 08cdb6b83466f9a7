"""fused_model / ops / plans on the CPU (torch path): same outputs as the model, clear errors, shared weights."""
import contextlib
import copy
import math
import os
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullfuse
from fullfuse import calls, ops, precision, torch_path, weights
from fullfuse.seed_models import SMALL_SHAPE, SeedA, SeedB
from same_answer import answer, assert_same_answer
from saved_and_loaded import saved_and_loaded


def _close(a, b, tol=1e-5):
    assert a.shape == b.shape
    assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max()


class Backbone(nn.Module):
    """A model with both patterns inside other layers."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.up = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x, v):
        a = self.fc(self.head(torch.relu(self.bn(self.stem(x)))))
        b = F.max_pool3d(self.up(v), 2).amax(dim=1)
        return a, b


@pytest.mark.parametrize("family", ["A", "B"])
def test_seed_models_same_output_on_cpu(family):
    torch.manual_seed(0)
    model = (SeedA() if family == "A" else SeedB()).eval()
    x = torch.randn(SMALL_SHAPE[family])
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        _close(fused(x), model(x))
    assert len(fused.plans) == 1
    plan = fused.plans[0]
    assert plan.family == family and plan.requested == "auto"
    assert plan.path == "fused"          # both seed patterns have a fused kernel (static plan)
    assert plan.last_path == "torch" and "cpu" in plan.last_reason


def test_bench_conv_option_builds_that_conv():
    from fullfuse.cli import _shape
    from fullfuse.seed_models import seed_model
    conv = seed_model("A", 3, 2, _shape("128,7,2,3")).conv
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding) == (
        3, 128, (7, 7), (2, 2), (3, 3))
    conv = seed_model("A", 8, 2, (32, 1)).conv
    assert (conv.out_channels, conv.kernel_size, conv.stride, conv.padding) == (32, (1, 1), (1, 1), (0, 0))
    assert seed_model("A").conv.kernel_size == (3, 3) and seed_model("A").conv.out_channels == 64
    with pytest.raises(ValueError, match="out_channels,kernel_size"):
        seed_model("A", 8, 2, (32,))


@pytest.mark.parametrize("cc", [(9, 0), (7, 5)])
def test_info_says_what_the_kernels_are_built_for_on_the_gpu(monkeypatch, capsys, cc):
    """`fullfuse info` with a GPU: the architecture the kernels are built for there, or why there are none (a GPU
    older than the kernels), from the same rule the kernels load by."""
    from fullfuse import info, runtime
    env = {"gpu": "a GPU", "compute_capability": f"{cc[0]}.{cc[1]}", "sms": 40, "driver": "1", "torch": "t",
           "cuda": "c", "cudnn": "d", "cudnn_frontend": None, "commit": "x"}
    monkeypatch.setattr(info, "environment", lambda: env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(runtime, "device_props", lambda index: runtime.DeviceProps(*cc, 40, 100 << 10))
    monkeypatch.setattr(runtime._nvrtc, "supported_archs", lambda: (75, 80, 86, 89, 90, 100, 120))
    runtime.arch_of.cache_clear()
    try:
        assert info.main() == 0
    finally:
        runtime.arch_of.cache_clear()
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kernels"))
    assert line.split(None, 1)[1] == ("built for sm_90a on this GPU" if cc == (9, 0) else
                                      "none on this GPU: fullfuse: this GPU is sm_75; the kernels need sm_80 "
                                      "(Ampere) or newer (path='auto' runs PyTorch's ops here)")


@pytest.mark.parametrize("argv", [["--shape", "1,2,3"], ["--shape", "2,8,16,16"],
                                  ["--family", "B", "--shape", "2,8,16,16"], ["--family", "A", "--shape", "2,8,0,16"]])
def test_bench_refuses_a_shape_its_models_cannot_take(capsys, argv):
    from fullfuse import cli
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", *argv])
    assert exit_.value.code == 2 and "family A takes (N, C, H, W)" in capsys.readouterr().err


def test_bench_plot_titles_name_a_changed_conv(tmp_path):
    pytest.importorskip("matplotlib")   # the [bench] extra; without it the plot is skipped with a hint (tested below)
    from fullfuse.bench import plot
    rows = [{"variant": "eager", "available": True, "median_ms": 1.0},
            {"variant": "fused", "available": True, "median_ms": 0.5}]
    base = {"shape": [2, 8, 32, 32], "dtype": "float32", "mode": "tf32", "layout": "contiguous", "rows": rows}
    plot([dict(base, family="A", conv="Conv2d(8, 128, kernel_size=(3, 3))"), dict(base, family="B", conv=None)],
         tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 0


def test_patterns_inside_a_larger_model():
    torch.manual_seed(1)
    model = Backbone().eval()
    x, v = torch.randn(2, 3, 20, 20), torch.randn(2, 4, 5, 5, 5)
    fused = fullfuse.fused_model(model)
    assert [p.family for p in fused.plans] == ["A", "B"]
    with torch.no_grad():
        for got, want in zip(fused(x, v), model(x, v)):
            _close(got, want)


def test_parameters_are_shared_and_reloads_are_seen():
    torch.manual_seed(2)
    model = SeedA().eval()
    fused = fullfuse.fused_model(model)
    other = SeedA().eval()
    model.load_state_dict(other.state_dict())
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        _close(fused(x), other(x))


class FunctionalA(nn.Module):
    """Family A through F.conv2d on the module's own tensors: the regions get weight and bias as inputs (no conv
    module to hold)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8, 3, 3) * 0.1)
        self.bias = nn.Parameter(torch.randn(16))
        self.w2 = nn.Parameter(torch.randn(5, 8, 3, 3))

    def forward(self, x):
        a = F.adaptive_avg_pool2d(F.gelu(F.conv2d(x, self.weight, self.bias)), 1)
        b = F.conv2d(x, self.w2).relu().mean(dim=(2, 3))
        return a, b


def test_functional_conv_regions():
    torch.manual_seed(3)
    model = FunctionalA().eval()
    fused = fullfuse.fused_model(model)
    assert [p.family for p in fused.plans] == ["A", "A"]
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for got, want in zip(fused(x), model(x)):
            _close(got, want)


def test_derived_weights_follow_every_weight_change():
    """Re-laid-out weights are derived in each call: in-place updates, writes through ``.data`` (no version bump),
    ``p.data = other`` and parameters made under inference_mode (no version counter) are all seen."""
    p = torch.nn.Parameter(torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last))   # re-laid out per call
    bias = torch.nn.Parameter(torch.randn(4).to(torch.bfloat16))
    for change in (lambda: p.data.mul_(0.5), lambda: p.data.add_(1.0),
                   lambda: setattr(p, "data", torch.randn(4, 3, 3, 3)), lambda: bias.data.mul_(2.0)):
        first = weights.contiguous(p)
        first_bias = weights.float32_bias(bias)
        assert torch.equal(first, p) and torch.equal(first_bias, bias.float())
        change()
        assert torch.equal(weights.contiguous(p), p)
        assert torch.equal(weights.float32_bias(bias), bias.float())
    with torch.inference_mode():
        w = torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last)
        assert torch.equal(weights.contiguous(w), w)


def test_path_torch_and_bad_arguments():
    model = SeedA().eval()
    assert fullfuse.fused_model(model, path="torch").plans[0].path == "torch"
    with pytest.raises(ValueError, match="path"):
        fullfuse.fused_model(model, path="fast")
    with pytest.raises(ValueError, match="precision"):
        fullfuse.fused_model(model, precision="fp64")


def test_fused_path_raises_where_no_fused_kernel():
    convt2d = nn.Sequential(nn.ConvTranspose2d(8, 4, 3, 2), nn.MaxPool2d(2))
    with pytest.raises(fullfuse.UnsupportedError, match="ConvTranspose3d only"):
        fullfuse.fused_model(_SumChannels(convt2d), path="fused")
    grouped = nn.Sequential(nn.Conv3d(4, 8, 3, groups=2), nn.GELU(), nn.AdaptiveAvgPool3d(1))
    with pytest.raises(fullfuse.UnsupportedError, match="groups"):
        fullfuse.fused_model(grouped, path="fused")
    assert fullfuse.fused_model(grouped).plans[0].path == "torch"


def test_conv3d_plans_the_fused_kernel():
    """A Conv3d region plans the fused kernel (checked again per input: it needs the sm_90 kernel and a ring that
    fits)."""
    conv3d = nn.Sequential(nn.Conv3d(2, 4, 3), nn.GELU(), nn.AdaptiveAvgPool3d(1))
    plan = fullfuse.fused_model(conv3d, path="fused").plans[0]
    assert (plan.family, plan.path, plan.spec.dims) == ("A", "fused", 3)
    assert fullfuse.fused_model(conv3d).plans[0].path == "fused"


def test_explicit_kernel_path_on_cpu_input_is_a_clear_error():
    fused = fullfuse.fused_model(SeedA().eval(), path="fallback")
    with pytest.raises(fullfuse.UnsupportedError, match="cpu"):
        with torch.no_grad():
            fused(torch.randn(SMALL_SHAPE["A"]))


@pytest.mark.parametrize("kwargs,reason", [({"groups": 2}, "groups"),
                                           ({"padding_mode": "reflect", "padding": 1}, "padding_mode")])
def test_unsupported_conv_parameters_run_torch_with_reason(kwargs, reason):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(4, 6, 3, **kwargs), nn.GELU(), nn.AdaptiveAvgPool2d(1)).eval()
    fused = fullfuse.fused_model(model)
    assert fused.plans[0].path == "torch" and reason in fused.plans[0].reason
    x = torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        _close(fused(x), model(x))
    with pytest.raises(fullfuse.UnsupportedError, match=reason):
        fullfuse.fused_model(model, path="fallback")


def test_grad_runs_torch_path_with_one_warning():
    torch.manual_seed(4)
    model = SeedA()
    fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    calls._warned_grad = False
    with pytest.warns(UserWarning, match="requires grad"):
        out = fused(x)
    out.sum().backward()
    assert model.conv.weight.grad is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused(x)


def test_unbatched_input():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1)).eval()
    x = torch.randn(3, 10, 11)
    with torch.no_grad():
        _close(fullfuse.fused_model(model)(x), model(x))


def test_invalid_input_gives_torchs_own_error():
    fused = fullfuse.fused_model(SeedA().eval())
    with torch.no_grad(), pytest.raises(RuntimeError):
        fused(torch.randn(2, 5, 16, 16))          # wrong channel count


def test_functional_ops_match_torch():
    torch.manual_seed(6)
    x, w, b = torch.randn(2, 3, 12, 13), torch.randn(7, 3, 3, 3), torch.randn(7)
    out = ops.conv_act_pool(x, w, b, stride=2, padding=1, activation="silu", pool="max", keepdim=False)
    _close(out, F.silu(F.conv2d(x, w, b, 2, 1)).amax(dim=(2, 3)))
    v, wt = torch.randn(1, 4, 5, 6, 5), torch.randn(4, 3, 3, 3, 3)
    out = ops.convt_pool_reduce(v, wt, None, stride=2, padding=1, output_padding=1, window=(2, 3, 2), reduction="mean")
    want = F.max_pool3d(F.conv_transpose3d(v, wt, None, 2, 1, 1), (2, 3, 2)).mean(dim=1, keepdim=True)
    _close(out, want)


@pytest.mark.parametrize("kernel, dilation", [(3, 1), (5, 1), (3, 2), ((3, 5), (2, 1))])
def test_functional_op_takes_string_padding_as_f_conv_does(kernel, dilation):
    x = torch.randn(2, 3, 12, 13)
    k = (kernel, kernel) if isinstance(kernel, int) else kernel
    w, b = torch.randn(7, 3, *k), torch.randn(7)
    for padding in ("same", "valid"):
        want = F.gelu(F.conv2d(x, w, b, 1, padding, dilation)).mean(dim=(2, 3), keepdim=True)
        _close(ops.conv_act_pool(x, w, b, padding=padding, dilation=dilation), want)


@pytest.mark.parametrize("call, says", [
    (lambda x, w: ops.conv_act_pool(x, w[..., :2, :2], padding="same"), "padding must be ints, 'valid' or 'same'"),
    (lambda x, w: ops.conv_act_pool(x, w, stride=2, padding="same"), "padding must be ints, 'valid' or 'same'"),
    (lambda x, w: ops.conv_act_pool(x, w, padding="full"), "padding must be ints, 'valid' or 'same'"),
    (lambda x, w: ops.conv_act_pool(x, w, stride="12"), "stride must be an int or 2 ints, got '12'"),
    (lambda x, w: ops.conv_act_pool(x, w, dilation=(1, "a")), "dilation must be an int or 2 ints"),
    (lambda x, w: ops.conv_act_pool(x, w[..., 0]), "takes the weight of a Conv2d or Conv3d, 4-d or 5-d; got 3-d"),
    (lambda x, w: ops.convt_pool_reduce(x, w[..., 0]), "takes the weight of a ConvTranspose2d or ConvTranspose3d"),
])
def test_functional_ops_say_what_they_take(call, says):
    """Arguments F.convNd would not take (or would take otherwise) are a ValueError naming what is taken, never a
    silent other reading (a stride "12" as (1, 2)) or an internal error."""
    with pytest.raises(ValueError, match=re.escape(says)):
        call(torch.randn(2, 3, 12, 13), torch.randn(7, 3, 3, 3))


def test_custom_ops_are_registered_and_pass_opcheck():
    assert hasattr(torch.ops.fullfuse, "conv_act_pool") and hasattr(torch.ops.fullfuse, "convt_pool_reduce")
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    for post in ("none", "flatten", "squeeze"):
        torch.library.opcheck(torch.ops.fullfuse.conv_act_pool.default,
                              (x, w, b, [1, 1], [0, 0], [1, 1], "gelu_erf", "mean", True, post, "auto", "auto", True))
    v, wt = torch.randn(1, 3, 4, 4, 4), torch.randn(3, 2, 3, 3, 3)
    torch.library.opcheck(torch.ops.fullfuse.convt_pool_reduce.default,
                          (v, wt, None, [2, 2, 2], [1, 1, 1], [0, 0, 0], [1, 1, 1], [2, 2, 2], "none", "sum", False,
                           "auto", "auto", True))


def test_custom_ops_compute_in_their_inputs_dtype_under_autocast(monkeypatch):
    """A registered op computes in its inputs' dtypes whatever autocast says, as its fake implementation says:
    torch.compile's graphs call it under the caller's autocast, on inputs their own casts made (autocast on CUDA
    simulated here: the region's autocast tests report it on for every input)."""
    monkeypatch.setattr(calls, "_cuda_autocast_on", lambda: True)
    monkeypatch.setattr(calls, "_autocast_dtype", lambda x: torch.bfloat16 if x.dtype == torch.float32 else None)
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    for xs in (x, x[0]):
        out = torch.ops.fullfuse.conv_act_pool(xs, w, b, [1, 1], [0, 0], [1, 1], "gelu_erf", "mean", True, "none",
                                               "auto", "auto", True)
        assert out.dtype == torch.float32
    v, wt = torch.randn(1, 3, 4, 4, 4), torch.randn(3, 2, 3, 3, 3)
    out = torch.ops.fullfuse.convt_pool_reduce(v, wt, None, [2, 2, 2], [1, 1, 1], [0, 0, 0], [1, 1, 1], [2, 2, 2],
                                               "none", "sum", False, "auto", "auto", True)
    assert out.dtype == torch.float32
    assert fullfuse.ops.conv_act_pool(x, w, b).dtype == torch.bfloat16   # (the wrapper: autocast's dtype)


@pytest.mark.parametrize("post", ["none", "flatten", "squeeze"])
def test_custom_ops_take_unbatched_inputs_as_the_wrappers(post):
    """The registered ops called directly, as the wrappers: an unbatched input is a batch of one, and the fake
    implementation gives the shape the real one returns (opcheck compares them)."""
    torch.manual_seed(3)
    x, w, b = torch.randn(3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    args = (w, b, [1, 1], [0, 0], [1, 1], "gelu_erf", "mean", True, post, "auto", "auto", True)
    got = torch.ops.fullfuse.conv_act_pool(x, *args)
    pooled = F.gelu(F.conv2d(x, w, b)).mean((-2, -1), keepdim=True)
    _close(got, torch_path.post_view(ops._spec_a_from(w, b, 1, 0, 1, "gelu_erf", "mean", True, post), pooled))
    torch.library.opcheck(torch.ops.fullfuse.conv_act_pool.default, (x, *args))
    v, wt = torch.randn(3, 4, 4, 4), torch.randn(3, 2, 3, 3, 3)
    b_args = (wt, None, [2, 2, 2], [1, 1, 1], [0, 0, 0], [1, 1, 1], [2, 2, 2], "none", "sum", False, "auto", "auto",
              True)
    got = torch.ops.fullfuse.convt_pool_reduce(v, *b_args)
    _close(got, fullfuse.ops.convt_pool_reduce(v[None], wt, None, 2, 1, 0, 1, 2, keepdim=False)[0])
    torch.library.opcheck(torch.ops.fullfuse.convt_pool_reduce.default, (v, *b_args))


def test_torch_compile_fullgraph():
    torch.manual_seed(7)
    model = Backbone().eval()
    x, v = torch.randn(2, 3, 20, 20), torch.randn(2, 4, 5, 5, 5)
    compiled = torch.compile(fullfuse.fused_model(model), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for got, want in zip(compiled(x, v), model(x, v)):
            _close(got, want)


@pytest.mark.parametrize("hook", ["forward_pre", "forward", "global_forward", "global_forward_pre", "backward",
                                  "compile", "jit_trace"])
def test_fused_model_calls_keep_module_semantics(hook):
    """The fused model's call skips nn.Module.__call__ only where nothing would see the difference: its hooks, torch's
    global module hooks, Module.compile() and TorchScript tracing all run as for any module."""
    torch.manual_seed(3)
    model = SeedA().eval()
    fused = fullfuse.fused_model(model)
    x = torch.randn(SMALL_SHAPE["A"])
    want = model(x).detach()
    seen, handles = [], []
    if hook == "forward_pre":
        handles.append(fused.register_forward_pre_hook(lambda m, args: (seen.append(1) or args[0] * 2,)))
        want = model(x * 2).detach()
    elif hook == "forward":
        handles.append(fused.register_forward_hook(lambda m, args, out: seen.append(1) or out + 1))
        want = want + 1
    elif hook == "global_forward":
        handles.append(nn.modules.module.register_module_forward_hook(
            lambda m, args, out: seen.append(1) if m is fused else None))
    elif hook == "global_forward_pre":
        handles.append(nn.modules.module.register_module_forward_pre_hook(
            lambda m, args: seen.append(1) if m is fused else None))
    elif hook == "backward":
        handles.append(fused.register_full_backward_hook(lambda m, gin, gout: seen.append(1)))
        x.requires_grad_(True)
    try:
        if hook == "compile":
            fused.compile(backend="eager")
            got = fused(x)
            seen.append(fused._compiled_call_impl is not None)
        elif hook == "jit_trace":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(fused, (x,), check_trace=False)
            got = traced(x)
            seen.append(len(list(traced.graph.nodes())) > 0)
        else:
            got = fused(x)
            if hook == "backward":
                got.sum().backward()
        _close(got.detach(), want)
        assert seen and all(seen)
    finally:
        for handle in handles:
            handle.remove()
    seen.clear()
    _close(fused(x.detach()).detach(), model(x.detach()).detach())   # hooks gone: the plain call again
    assert not seen


def test_precision_auto_follows_torch(monkeypatch):
    with precision.cudnn_conv_precision("ieee"):
        assert precision.resolve("auto", torch.float32) == "ieee"
    with precision.cudnn_conv_precision("tf32"):
        assert precision.resolve("auto", torch.float32) == "tf32"
    assert precision.resolve("ieee", torch.float32) == "ieee"
    assert precision.resolve("auto", torch.bfloat16) == "bfloat16"


def test_untraceable_model_without_parts_runs_as_it_is_and_says_why():
    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    model = Branchy()
    with pytest.warns(UserWarning, match="(?s)could not trace Branchy.*control flow.*own forward unchanged"):
        fused = fullfuse.fused_model(model)
    x = torch.randn(3)
    assert torch.equal(fused(x), model(x)) and fused.plans == []


def test_fused_model_takes_modules_only():
    with pytest.raises(TypeError, match="fused_model takes a torch.nn.Module, got function"):
        fullfuse.fused_model(lambda x: x)


@pytest.mark.parametrize("make", ["script", "trace"])
def test_a_torchscript_module_runs_unchanged_and_says_how_to_fuse(make):
    """A TorchScript module (torch.jit.script / torch.jit.trace) has no Python forward for fx to follow: the fused
    model runs it as it is, with a warning naming the fix (fuse the Python module it was made from)."""
    model, x = SeedA().eval(), torch.randn(2, 8, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # (torch.jit's own, on newer torch)
        ts = torch.jit.script(model) if make == "script" else torch.jit.trace(model, x)
    with pytest.warns(UserWarning, match="(?s)TorchScript module.*call fused_model on the Python module"):
        fused = fullfuse.fused_model(ts)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(fused(x), ts(x))
    assert fused.plans == []


@pytest.mark.parametrize("make", ["script", "trace"])
def test_a_torchscript_submodule_is_one_call_and_the_rest_is_fused(make):
    """A model holding a TorchScript module: fx keeps that module as one call (it cannot trace into TorchScript), the
    rest traces and its conv pipelines are fused; the module-tree check passes over the TorchScript module's
    children."""
    class Outer(nn.Module):
        def __init__(self, child):
            super().__init__()
            self.child, self.region = child, SeedA()

        def forward(self, x):
            return self.region(x) + self.child(x)

    x = torch.randn(2, 8, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        inner = SeedA().eval()
        child = torch.jit.script(inner) if make == "script" else torch.jit.trace(inner, x)
    model = Outer(child).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # (no warning: the model traced as a whole)
        fused = fullfuse.fused_model(model)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(fused(x), model(x))
    assert [plan.name for plan in fused.plans] == ["fullfuse_region_0"]
    called = [node.target for node in fused.graph_module.graph.nodes if node.op == "call_module"]
    assert "child" in called
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model.child = torch.jit.script(SeedA().eval()) if make == "script" else torch.jit.trace(SeedA().eval(), x)
    with pytest.warns(UserWarning, match="child"):   # (a re-assigned child: the model's own forward, as for any)
        with torch.no_grad():
            assert torch.equal(fused(x), model(x))


class _VarargsKeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = SeedA()

    def forward(self, x, *rest, scale=1.0):
        return self.a(x) * scale


class _KeywordOnlyFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = SeedA()

    def forward(self, x, *, flip=False):
        return -self.a(x) if flip else self.a(x)


@pytest.mark.parametrize("model, calls", [
    (_VarargsKeywordOnly, [((), {}), ((3,), {"scale": 2.0}), ((), {"scale": 2.0}), ((1, 2), {})]),
    (_KeywordOnlyFlag, [((), {}), ((), {"flip": True})]),
])
def test_forward_signatures_with_keyword_only_parameters_take_every_valid_call(model, calls):
    """fx's graph takes a keyword-only parameter positionally, before *args (forward(self, x, scale=1.0, *rest)): a
    call giving *args and the keyword failed.  Such a model runs its own forward around its fused submodules; a
    keyword-only flag without *args is an optional input as any other."""
    model, x = model().eval(), torch.randn(2, 8, 16, 16)
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        for args, kwargs in calls:
            assert torch.equal(fused(x, *args, **kwargs), model(x, *args, **kwargs))
    assert fused.plans and all(plan.path == "fused" for plan in fused.plans)


class _SumChannels(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x).sum(dim=1, keepdim=True)


def test_torch_conv_precision_resolves_every_level_as_the_attributes_do():
    """The one-call resolution (torch's legacy getter, the levels walked only where it raises) gives what the
    fp32_precision attributes say for the conv — its own level, else cuDNN's, else the generic one, else the legacy
    flag — for every combination of the levels, the RNN's and the legacy flag set before or after them."""
    import itertools

    from fullfuse import precision

    cudnn = torch.backends.cudnn
    if precision._FAST is None:
        pytest.skip("this torch has no fp32_precision getters")
    holders = (torch.backends, cudnn, cudnn.conv, cudnn.rnn)
    before = [h.fp32_precision for h in holders]
    legacy_before = torch._C._get_cudnn_allow_tf32()
    values, checked = ("none", "tf32", "ieee"), 0
    try:
        for legacy_first, legacy, levels in itertools.product((True, False), (None, True, False),
                                                              itertools.product(values, repeat=4)):
            if legacy_first and legacy is not None:
                cudnn.allow_tf32 = legacy
            try:
                for holder, value in zip(holders, levels):
                    holder.fp32_precision = value
            except (RuntimeError, ValueError):
                continue
            if not legacy_first and legacy is not None:
                cudnn.allow_tf32 = legacy
            assert precision.torch_conv_precision() == precision._walked_levels(), (legacy_first, legacy, levels)
            checked += 1
    finally:   # (the legacy flag first: setting it sets the levels too)
        cudnn.allow_tf32 = legacy_before
        for holder, value in zip(holders, before):
            holder.fp32_precision = value
    assert [h.fp32_precision for h in holders] == before and torch._C._get_cudnn_allow_tf32() == legacy_before
    assert checked >= 400


def test_precision_flags_change_only_under_the_lock_and_come_back():
    """Threads asking for other precisions than torch's never interleave a flag change with another's restore, nor
    run while another has changed it (the flags end as they began)."""
    import threading

    from fullfuse import precision

    before = (precision.torch_conv_precision(), torch.backends.cudnn.deterministic)
    errors = []

    def worker(mode):
        try:
            for _ in range(200):
                with precision.cudnn_settings(mode, deterministic=True):
                    assert precision.torch_conv_precision() == mode and torch.backends.cudnn.deterministic
        except Exception as exc:  # collected: an assert in a thread does not fail the test by itself
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(m,)) for m in ("ieee", "tf32") * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert (precision.torch_conv_precision(), torch.backends.cudnn.deterministic) == before
    with precision.cudnn_conv_precision(before[0]):
        assert precision.torch_conv_precision() == before[0]


def test_bench_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path, capsys):
    """matplotlib is the [bench] extra: without it the benchmark still writes its JSON and says what to install."""
    import builtins
    from fullfuse import bench
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert bench.plot([], tmp_path / "x.png") is False
    assert "pip install 'fullfuse[bench]'" in capsys.readouterr().out
    assert not (tmp_path / "x.png").exists()


def test_called_submodules_bound_for_the_generated_forward():
    """fx's generated forward fetches called submodules by attribute: fused_model binds them in the instance dicts of
    the modules it owns (the GraphModule, fx's plain containers) so no call pays nn.Module.__getattr__, leaves the
    user's modules' dicts alone, and a re-assigned submodule is the one that runs."""
    import copy

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(8, 64, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1))
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

        def forward(self, x):
            return self.head(self.body(x))

    model = Net().eval()
    user_dicts = {id(m): set(vars(m)) for m in model.modules()}
    fused = fullfuse.fused_model(model)
    gm = fused.graph_module
    assert "fullfuse_region_0" in vars(gm) and "head" in vars(gm)
    assert type(gm.head) is nn.Module and "1" in vars(gm.head)      # fx's container for head.0 / head.1
    assert vars(gm.head)["1"] is model.head[1]
    assert {id(m): set(vars(m)) for m in model.modules()} == user_dicts
    x = torch.randn(2, 8, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x))
        twin = copy.deepcopy(fused)   # (fx rebuilds a copied GraphModule from its graph: no binding, none stale)
        tgm = twin.graph_module
        region = tgm._modules["fullfuse_region_0"]
        assert vars(tgm).get("fullfuse_region_0", region) is region
        gm.head.__setattr__("1", nn.Linear(64, 3))                    # re-assigned: the new one runs
        assert fused(x).shape == (2, 3) and twin(x).shape == (2, 10)


def test_lone_region_runs_directly():
    """A fused model whose graph is one region called on its one input calls that region's forward directly (no
    generated forward, ~1 us of host time), re-derives that from the graph whenever the graph's forward changes
    (deepcopy, recompile, pickling: torch.save after calls works), and takes the graph as before for keyword calls,
    for a region replaced by another module and for graphs with anything else in them."""
    import copy
    import io

    from fullfuse.model import lone_region

    model = nn.Sequential(nn.Conv2d(8, 16, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1)).eval()
    fused = fullfuse.fused_model(model)
    gm = fused.graph_module
    assert lone_region(gm) == "fullfuse_region_0"
    x = torch.randn(2, 8, 10, 10)
    with torch.no_grad():
        want = model(x)
        calls = []
        real_forward = type(gm).forward

        def counted(self, *args, **kwargs):
            calls.append(1)
            return real_forward(self, *args, **kwargs)
        type(gm).forward = counted                                     # (a new forward: looked at again)
        torch.testing.assert_close(fused(x), want)
        assert calls == []                                             # the region ran directly
        keyword = next(iter(gm.graph.nodes)).target                     # the input's name (Sequential: "input")
        torch.testing.assert_close(fused(**{keyword: x}), want)
        assert calls == [1]                                            # keywords: the generated forward
        buf = io.BytesIO()
        torch.save(fused, buf)                                         # after calls: pickles (no fx function kept)
        buf.seek(0)
        torch.testing.assert_close(torch.load(buf, weights_only=False)(x), want)
        twin = copy.deepcopy(fused)
        twin.graph_module._modules["fullfuse_region_0"].conv.weight.mul_(2)
        assert not torch.allclose(twin(x), want) and torch.allclose(fused(x), want)   # each its own region
        gm.fullfuse_region_0 = nn.Flatten()                            # replaced: the graph calls the new module
        assert fused(x).shape == (2, 8 * 10 * 10)
        gm.graph.call_function(torch.relu, (next(iter(gm.graph.nodes)),))   # anything else in the graph: not lone
        gm.recompile()
        assert lone_region(gm) is None and fused(x).shape == (2, 8 * 10 * 10)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(8, 16, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1))
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(self.body(x).flatten(1))

    head = Head().eval()
    fused_head = fullfuse.fused_model(head)
    assert lone_region(fused_head.graph_module) is None and lone_region(head) is None
    with torch.no_grad():
        torch.testing.assert_close(fused_head(x), head(x))


def test_a_call_signature_is_prepared_once_and_again_for_whatever_it_depends_on(monkeypatch):
    """The common call finds its prepared call by its signature (the key the first call kept it under); the dtype,
    device and layout of the input, the weight's dtype and torch's float32 precision under "auto" each make a new
    signature.  Each fused model's plans show its own last decision, also for one spec run on two paths."""
    from fullfuse import dispatch
    prepared = []
    real = dispatch.prepare

    def counting(spec, path, precision_, mode, *args):
        prepared.append((path, mode))
        return real(spec, path, precision_, mode, *args)
    monkeypatch.setattr(dispatch, "prepare", counting)
    monkeypatch.setattr(calls, "_registry", {})
    model = SeedA().eval()
    auto, torch_path = fullfuse.fused_model(model), fullfuse.fused_model(model, path="torch")
    x = torch.randn(SMALL_SHAPE["A"])
    with torch.no_grad():
        for _ in range(3):
            auto(x)
        assert prepared == [("auto", precision.torch_conv_precision())]
        auto(x.contiguous(memory_format=torch.channels_last))
        assert len(prepared) == 2
        other = "ieee" if precision.torch_conv_precision() == "tf32" else "tf32"
        with precision.cudnn_conv_precision(other):
            auto(x)
        assert prepared[-1] == ("auto", other)
        torch_path(x)
        assert prepared[-1][0] == "torch" and len(prepared) == 4
        assert auto.plans[0].last_path == "torch" and "cpu" in auto.plans[0].last_reason
        assert torch_path.plans[0].last_reason == "requested"
        model.double()
        auto(x.double())
        with pytest.raises(RuntimeError):
            auto(x)                                       # float input, double weight: torch's own error
    assert len(prepared) == 6


def test_prepared_calls_stay_bounded(monkeypatch):
    """Ever new shapes and specs do not grow the kept calls without limit: each SpecCalls keeps at most LIMIT
    signatures, the registry at most REGISTRY_LIMIT SpecCalls, and a call after either was cleared still answers."""
    monkeypatch.setattr(calls, "_registry", {})
    monkeypatch.setattr(calls.SpecCalls, "LIMIT", 3)
    monkeypatch.setattr(calls, "REGISTRY_LIMIT", 2)
    model = SeedA().eval()
    fused = fullfuse.fused_model(model)
    region_calls = fused.plans[0].calls
    with torch.no_grad():
        for size in range(8, 16):
            x = torch.randn(1, 8, size, size)
            _close(fused(x), model(x))
            assert len(region_calls._prepared) <= 3
        w = torch.randn(4, 8, 3, 3)
        for stride in range(1, 5):
            ops.conv_act_pool(torch.randn(1, 8, 9, 9), w, stride=stride)
            assert len(calls._registry) <= 2


@pytest.mark.parametrize("family", ["A", "B"])
def test_cpu_autocast_gives_the_models_own_answer(family):
    """Autocast on another device than CUDA (the common call asks CUDA's only: a CPU input's prepared call is PyTorch's
    ops, which CPU autocast casts): the region runs as the model would under it, in the dtype the model returns there,
    bit for bit on the torch path."""
    torch.manual_seed(0)
    model = (SeedA() if family == "A" else SeedB()).eval()
    x = torch.randn(SMALL_SHAPE[family])
    fused = fullfuse.fused_model(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = fused(x), model(x)
    assert got.dtype == want.dtype and torch.equal(got, want)


def _conv_of(model):
    return next(m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose3d)))


class _Negated(nn.Module):
    def forward(self, w):
        return -w


@pytest.mark.parametrize("kind", ["weight_norm", "custom", "bias"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_parametrized_conv_gives_the_models_answer(family, kind):
    """A conv whose weight (or bias) is a parametrization (torch.nn.utils.parametrize) has no such entry among its
    parameters: the region reads it as the conv's forward does (fullfuse raised KeyError here before)."""
    torch.manual_seed(0)
    model = (SeedA() if family == "A" else SeedB()).eval()
    conv = _conv_of(model)
    if kind == "weight_norm":
        torch.nn.utils.parametrizations.weight_norm(conv)
    else:
        torch.nn.utils.parametrize.register_parametrization(conv, "weight" if kind == "custom" else "bias",
                                                            _Negated())
    x = torch.randn(SMALL_SHAPE[family])
    fused = fullfuse.fused_model(model)
    assert fused.plans, "the parametrized conv's pipeline is matched"
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))


def test_weight_shapes_of_specs():
    """The weight shape a region's kernels are planned for (a call with any other runs PyTorch's ops)."""
    a = fullfuse.spec.ConvActPoolSpec(2, 8, 64, (3, 5), (1, 1), (0, 0), (1, 1), True, groups=2)
    b = fullfuse.spec.ConvTPoolReduceSpec(3, 32, 64, (5, 5, 5), (2,) * 3, (2,) * 3, (0,) * 3, (1,) * 3, True,
                                          (6, 6, 6), groups=2)
    assert a.weight_shape == (64, 4, 3, 5)
    assert b.weight_shape == (32, 32, 5, 5, 5)
    assert a.weight_shape == nn.Conv2d(8, 64, (3, 5), groups=2).weight.shape
    assert b.weight_shape == nn.ConvTranspose3d(32, 64, 5, groups=2).weight.shape


def _replicate_like_data_parallel(module: nn.Module, scale: float) -> nn.Module:
    """One replica of ``module`` made the way torch.nn.parallel.replicate makes them (which needs GPUs): every
    module copied by _replicate_for_data_parallel, children set as attributes, parameters as plain tensors (here
    scaled, so that reading the original's would show)."""
    modules = list(module.modules())
    copies = {id(m): m._replicate_for_data_parallel() for m in modules}
    for m in modules:
        replica = copies[id(m)]
        for key, child in m._modules.items():
            setattr(replica, key, None if child is None else copies[id(child)])
        for key, param in m._parameters.items():
            setattr(replica, key, None if param is None else param.detach() * scale)
    return copies[id(module)]


@pytest.mark.parametrize("family", ["A", "B"])
def test_data_parallel_replica_uses_its_own_weights(family):
    """A replica as DataParallel makes it: its modules are copies holding their own weights as attributes (fullfuse
    keeps called submodules in the graph module's instance dict, which the replica's setattr must replace)."""
    torch.manual_seed(0)
    model = (SeedA() if family == "A" else SeedB()).eval()
    x = torch.randn(SMALL_SHAPE[family])
    fused = fullfuse.fused_model(model)
    replica = _replicate_like_data_parallel(fused, 2.0)
    scaled = _replicate_like_data_parallel(model, 2.0)
    with torch.no_grad():
        assert torch.equal(replica(x), scaled(x))
        assert torch.equal(fused(x), model(x))


def _doubling_hook(module, args, output):
    return output * 2


def _shifting_pre_hook(module, args):
    return (args[0] + 1,)


@pytest.mark.parametrize("when", ["after a call", "before the first call"])
@pytest.mark.parametrize("change", ["conv hook", "conv pre-hook", "activation hook", "pool pre-hook",
                                    "conv hook dict replaced", "global hook", "conv padding", "conv stride",
                                    "second module's setting"])
@pytest.mark.parametrize("family", ["A", "B"])
def test_changes_after_fused_model_give_the_models_answer(family, change, when):
    """What the plan cannot see, made after fused_model (before its first call too): a forward hook or pre-hook on one
    of the region's modules (which may change what flows on; also in a hook dict put in place of the module's own),
    torch's global module hooks, a setting of one of its
    modules changed (the conv's padding or stride, GELU's approximation, a max-pool's window).  The region runs its
    own ops then (every hook fires, as in the model); once undone, the plan's path again."""
    torch.manual_seed(0)
    model = (SeedA() if family == "A" else SeedB()).eval()
    x = torch.randn(SMALL_SHAPE[family])
    fused = fullfuse.fused_model(model)
    modules = [m for m in model.modules() if m is not model]
    conv, second = modules[0], modules[1]   # (A: conv, GELU, pool; B: conv-transpose, the first max-pool)
    calls = fused.plans[0].calls
    with torch.no_grad():
        if when == "after a call":
            fused(x)
        plain = calls.last if when == "after a call" else None
        fired = []
        undo = None
        if change == "conv hook":
            undo = conv.register_forward_hook(lambda m, a, out: fired.append(1) or out * 2).remove
        elif change == "conv pre-hook":
            undo = conv.register_forward_pre_hook(lambda m, a: fired.append(1) or _shifting_pre_hook(m, a)).remove
        elif change == "activation hook":
            undo = second.register_forward_hook(lambda m, a, out: fired.append(1) or out * 2).remove
        elif change == "pool pre-hook":
            undo = modules[-1].register_forward_pre_hook(lambda m, a: fired.append(1) or (a[0] * 3,)).remove
        elif change == "conv hook dict replaced":
            hooks = conv._forward_hooks
            conv._forward_hooks = type(hooks)({-1: lambda m, a, out: fired.append(1) or out * 2})
            undo = lambda: setattr(conv, "_forward_hooks", hooks)   # noqa: E731
        elif change == "global hook":
            undo = torch.nn.modules.module.register_module_forward_hook(
                lambda m, a, out: fired.append(m) or None).remove
        elif change == "conv padding":
            was, conv.padding = conv.padding, tuple(p + 1 for p in conv.padding)
            undo = lambda: setattr(conv, "padding", was)   # noqa: E731
        elif change == "conv stride":
            was, conv.stride = conv.stride, tuple(s + 1 for s in conv.stride)
            undo = lambda: setattr(conv, "stride", was)   # noqa: E731
        else:
            name, value = ("approximate", "tanh") if family == "A" else ("kernel_size", 1)
            was = getattr(second, name)
            setattr(second, name, value)
            undo = lambda: setattr(second, name, was)   # noqa: E731
        try:
            want = model(x)
            by_model = [m for m in fired if m is not model]
            del fired[:]
            got = fused(x)
            assert torch.equal(got, want), change
            # (a global hook also sees the fused model, which stands for the model's root)
            assert [m for m in fired if m == 1 or m in modules] == by_model, "the hooks fire as in the model"
            # (under a global hook the model's own forward runs: every module call fires it, as in the model)
            ran = "own forward" if change == "global hook" else "own ops"
            assert calls.last[0] == "torch" and ran in calls.last[1]
        finally:
            undo()
        assert torch.equal(fused(x), model(x))
        assert "own ops" not in calls.last[1] and "own forward" not in calls.last[1]
        assert plain is None or calls.last == plain


def test_a_model_holding_a_fused_part_fuses_the_rest():
    """fused_model on a model one of whose parts was fused before (as TraceError's advice suggests): the fused part
    stays one module call, the rest's pipelines are matched; a fused model itself is refused with the fix."""
    torch.manual_seed(0)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = SeedA(), SeedA()

        def forward(self, x):
            return self.first(x) + self.second(x)

    model = Outer().eval()
    x = torch.randn(SMALL_SHAPE["A"])
    model.first = fullfuse.fused_model(model.first)
    fused = fullfuse.fused_model(model)
    assert len(fused.plans) == 1 and isinstance(fused.graph_module.get_submodule("first"), fullfuse.FusedModel)
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))
    with pytest.raises(ValueError, match="fused already"):
        fullfuse.fused_model(fused)


def test_backward_hook_fires_as_in_the_model():
    """A full backward hook registered on the conv after fused_model: with autograd on, the region runs its own ops
    (the conv module is called, so the hook fires in backward with the same gradients); under no_grad it changes
    nothing the plan cannot see."""
    torch.manual_seed(0)
    model = SeedA().eval()
    x = torch.randn(SMALL_SHAPE["A"])
    fused = fullfuse.fused_model(model)
    seen = {"model": [], "fused": []}
    which = ["model"]
    model.conv.register_full_backward_hook(lambda m, gin, gout: seen[which[0]].append(gout[0].clone()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(x).sum().backward()
        which[0] = "fused"
        fused(x).sum().backward()
    assert len(seen["fused"]) == len(seen["model"]) == 1
    assert torch.allclose(seen["fused"][0], seen["model"][0])
    assert "own ops" in fused.plans[0].last_reason
    with torch.no_grad():
        fused(x)
    assert "own ops" not in fused.plans[0].last_reason


@pytest.mark.parametrize("when", ["before fused_model", "after fused_model"])
def test_a_forward_set_on_an_instance_is_the_one_that_runs(when):
    """A module whose forward is set on the instance (accelerate's hooks wrap forward this way): matched as a plain
    module neither before fused_model (its class's forward is not what runs) nor after (the region's own ops then)."""
    torch.manual_seed(0)
    model = SeedA().eval()
    x = torch.randn(SMALL_SHAPE["A"])
    conv = model.conv

    def patch():
        plain = conv.forward
        conv.forward = lambda y: plain(y) * 2
    if when == "before fused_model":
        patch()
        with pytest.warns(UserWarning, match="no fusable conv pipeline"):   # (the conv is not a plain module)
            fused = fullfuse.fused_model(model)
    else:
        fused = fullfuse.fused_model(model)
    if when == "after fused_model":
        patch()
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))


class _Tail(nn.Module):
    """conv -> activation -> the reduction ``tail`` (a function of the conv output)."""

    def __init__(self, conv, tail):
        super().__init__()
        self.conv, self.tail = conv, tail

    def forward(self, x):
        return self.tail(self.conv(x))


_UNBATCHED_CASES = {   # name: (model maker, counts a dim from the batch)
    "B sum(1)": (lambda: SeedB(), True),
    "B sum(-4)": (lambda: _Tail(nn.ConvTranspose3d(32, 8, 3, 2, 1), lambda y: F.max_pool3d(y, 2).sum(-4)), False),
    "B amax(dim=1)": (lambda: _Tail(nn.ConvTranspose3d(32, 8, 3, 2, 1), lambda y: F.max_pool3d(y, 2).amax(dim=1)),
                      True),
    "A mean((2, 3))": (lambda: _Tail(nn.Conv2d(8, 6, 3), lambda y: F.gelu(y).mean((2, 3))), True),
    "A mean((-2, -1))": (lambda: _Tail(nn.Conv2d(8, 6, 3), lambda y: F.gelu(y).mean((-2, -1))), False),
    "A adaptive pool": (lambda: SeedA(), False),
}


@pytest.mark.parametrize("case", list(_UNBATCHED_CASES))
def test_unbatched_input_is_the_ops_as_written(case):
    """An unbatched input where the region's reduction names a dim counted from the batch (``sum(1)``: the channels
    of a batch, the depth of one unbatched volume; ``mean((2, 3))``: out of range unbatched) gets what the model's ops
    as written give, PyTorch's error included (before: the channel reduction of a batch of one, another shape).
    Dims counted from the end mean the same either way: those keep the batch-of-one path."""
    make, from_batch = _UNBATCHED_CASES[case]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(SMALL_SHAPE[case[0]][1:])
    fused = fullfuse.fused_model(model)
    assert fused.plans, case
    with torch.no_grad():
        try:
            want = model(x)
        except (IndexError, RuntimeError) as exc:
            with pytest.raises(type(exc)):
                fused(x)
            return
        got = fused(x)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6)
    assert ("own ops" in fused.plans[0].last_reason) == from_batch, fused.plans[0].last_reason


@pytest.mark.parametrize("family", ["A", "B"])
def test_a_conv_bias_held_as_a_buffer_is_added(family):
    """A conv whose bias parameter was replaced by a buffer of that name (its forward reads ``self.bias`` either way):
    the region adds it (fullfuse read the parameter dict only and dropped the bias, silently)."""
    torch.manual_seed(0)
    model = (SeedA() if family == "A" else SeedB()).eval()
    conv = _conv_of(model)
    x = torch.randn(SMALL_SHAPE[family])
    fused = fullfuse.fused_model(model)
    bias = conv.bias.detach() + 3.0
    del conv.bias
    conv.register_buffer("bias", bias)
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_fused_model_sees_changes_to_its_own_modules(how):
    """A deepcopy or an unpickled fused model watches its own modules' instance dicts and torch's live global hooks
    (a copy of the watch would hold the original's dicts, or copies of the globals, and miss both)."""
    import copy
    import io
    torch.manual_seed(0)
    model = SeedA().eval()
    x = torch.randn(SMALL_SHAPE["A"])
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        fused(x)
    if how == "deepcopy":
        twin = copy.deepcopy(fused)
    else:
        buf = io.BytesIO()
        torch.save(fused, buf)
        buf.seek(0)
        twin = torch.load(buf, weights_only=False)
    conv = twin.graph_module.get_submodule("fullfuse_region_0").conv
    reference = copy.deepcopy(model)
    with torch.no_grad():
        fired = []
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, a, out: fired.append(m) if m is conv else None)
        try:
            twin(x)
        finally:
            handle.remove()
        assert fired == [conv]
        plain = conv.forward
        conv.forward = lambda y: plain(y) * 2
        ref_plain = reference.conv.forward
        reference.conv.forward = lambda y: ref_plain(y) * 2
        assert torch.equal(twin(x), reference(x))


def test_torch_deterministic_algorithms_override_a_nondeterministic_region(monkeypatch):
    """fused_model(..., deterministic=False) under torch.use_deterministic_algorithms(True): each call is prepared
    deterministic, as PyTorch's own ops would be; the same signature without it prepares the atomic variant."""
    from fullfuse import dispatch
    seen = []
    real = dispatch.prepare

    def recording(spec, path, precision, mode, deterministic, x, weight, bias):
        seen.append(deterministic)
        return real(spec, path, precision, mode, deterministic, x, weight, bias)
    monkeypatch.setattr(dispatch, "prepare", recording)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 5, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1)).eval()   # (a spec of its own)
    fused = fullfuse.fused_model(model, deterministic=False)
    x = torch.randn(2, 8, 9, 9)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        with torch.no_grad():
            fused(x)
            torch.use_deterministic_algorithms(True)
            fused(x)
            fused(x)
    finally:
        torch.use_deterministic_algorithms(was)
    assert seen == [False, True]


def test_region_graph_takes_only_its_inputs():
    """original_ops.region_graph: the region's nodes as a graph of the given inputs; None where a node reads any other
    value of the model's graph (the region's own ops could not run alone)."""
    from fullfuse.original_ops import region_graph

    class TwoInputs(nn.Module):
        def forward(self, x, y):
            return (x + y).relu()
    gm = torch.fx.symbolic_trace(TwoInputs())
    named = {n.name: n for n in gm.graph.nodes}
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert region_graph(gm, nodes, (named["x"],)) is None
    both = region_graph(gm, nodes, (named["x"], named["y"]))
    a, b = torch.randn(3), torch.randn(3)
    assert torch.equal(both(a, b), (a + b).relu())


@pytest.mark.parametrize("family", ["A", "B"])
def test_a_torchscript_trace_records_the_regions_ops(family):
    """torch.jit.trace (and ONNX export, which uses it) of a fused model: the model's own forward runs, so the trace
    holds the convolution (a kernel launch would be missing from it, its output an uninitialised tensor), and the
    traced module gives the model's answer."""
    torch.manual_seed(0)
    model = (SeedA() if family == "A" else SeedB()).eval()
    x = torch.randn(SMALL_SHAPE[family])
    fused = fullfuse.fused_model(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # (torch.jit.trace's own)
        traced = torch.jit.trace(fused, x, check_trace=False)   # (its check calls the model again, untraced)
        assert "model's own forward" in fused.plans[0].last_reason and "TorchScript" in fused.plans[0].last_reason
        assert any("convolution" in node.kind() for node in traced.inlined_graph.nodes())
        assert torch.equal(traced(x * 2), model(x * 2))


def _small_seed(family: str):
    """A small seed model of ``family`` (random weights, seed 0) and an input for it."""
    torch.manual_seed(0)
    model = (SeedA(8, 6) if family == "A" else SeedB(4, 6, 3, 2, 1)).eval()
    return model, torch.randn(2, 8, 9, 9) if family == "A" else torch.randn(2, 4, 5, 5, 5)


def _stub_kernel_path(monkeypatch):
    """Every call signature prepared from here on runs a stub of the kernel path: PyTorch's answer as NaN (its shape
    and dtype), each call's input type appended to the returned list ``launched``.  ``launched.stubbed = False``
    prepares the real calls again (for signatures not prepared yet: the registry starts empty here).  The CPU input
    stands for a CUDA one: a region's own ops serve a non-CUDA input under autocast, and that test is off here."""
    from fullfuse import dispatch, region
    monkeypatch.setattr(region, "any_autocast", lambda: False)
    real = dispatch.prepare
    launched = _Launched()

    def stub(spec, path, precision, mode, deterministic, x, weight, bias):
        kept = real(spec, path, precision, mode, deterministic, x, weight, bias)
        if not launched.stubbed:
            return kept

        def run(x, weight, bias):
            launched.append(type(x))
            return torch.full_like(torch_path.run(spec, x.as_subclass(torch.Tensor), weight, bias), float("nan"))
        return ("fused", "stub"), run
    monkeypatch.setattr(dispatch, "prepare", stub)
    monkeypatch.setattr(calls, "_registry", {})
    return launched


class _Launched(list):
    stubbed = True


def _transform_cases():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils.flop_counter import FlopCounterMode
    fwad = torch.autograd.forward_ad

    def vmapped(model, x):
        return torch.func.vmap(model)(torch.stack([x, 2 * x]))

    def jvp(model, x):
        return torch.func.jvp(model, (x,), (torch.ones_like(x),))

    def dual(model, x):
        with fwad.dual_level():
            out = fwad.unpack_dual(model(fwad.make_dual(x, torch.ones_like(x))))
        return out.primal, out.tangent

    def traced(model, x):
        return make_fx(model)(x)(x)   # the graph make_fx recorded, run

    def flops(model, x):
        counter = FlopCounterMode(display=False)
        with counter:
            out = model(x)
        return out, torch.tensor(float(counter.get_total_flops()))
    def function_mode(model, x):
        with _DoublingConvs():
            return model(x)
    return {"vmap": vmapped, "jvp": jvp, "dual": dual, "make_fx": traced, "flop_counter": flops,
            "function_mode": function_mode}


class _DoublingConvs(torch.overrides.TorchFunctionMode):
    """A torch function mode that changes what conv ops return (doubles them)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if func in (F.conv2d, F.conv_transpose3d, torch.conv2d, torch.conv_transpose3d) else out


@pytest.mark.parametrize("family", ["A", "B"])
@pytest.mark.parametrize("case", ["vmap", "jvp", "dual", "make_fx", "flop_counter", "function_mode"])
def test_torch_func_transforms_and_dispatch_modes_see_pytorchs_ops(monkeypatch, family, case):
    """Under a torch.func transform, forward-mode AD or a torch dispatch mode, a region runs PyTorch's ops: the
    transform's answer (batched values, tangents), a make_fx graph that computes the model, FlopCounterMode's count
    are the original model's.  A kernel there would be invisible to them (its tensors have no storage to launch on,
    or its work would be missing from the graph).  The kernel path is stubbed with NaN outputs, which the plain call
    returns: the stub is live."""
    launched = _stub_kernel_path(monkeypatch)
    model, x = _small_seed(family)
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        assert torch.isnan(fused(x)).all() and len(launched) == 1
        got, want = _transform_cases()[case](fused, x), _transform_cases()[case](model, x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        _close(g, w)
    assert len(launched) == 1
    assert fused.plans[0].last_path == "torch"


class _Scaled(torch.Tensor):
    """A tensor subclass whose __torch_function__ changes what conv ops return (doubles them): PyTorch's answer for it
    is its own."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func in (F.conv2d, F.conv_transpose3d, torch.conv2d, torch.conv_transpose3d):
            out = out * 2
        return out


@pytest.mark.parametrize("family", ["A", "B"])
@pytest.mark.parametrize("which", ["input", "weight"])
def test_tensor_subclasses_get_their_own_answer(monkeypatch, family, which):
    """An input or weight of a tensor subclass runs PyTorch's ops, which the subclass overrides: the answer is the
    original model's with that subclass; a plain tensor, or a Parameter, still runs the kernel path (stubbed: NaN)."""
    launched = _stub_kernel_path(monkeypatch)
    model, x = _small_seed(family)
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        assert torch.isnan(fused(x)).all() and torch.isnan(fused(nn.Parameter(x))).all() and len(launched) == 2
        if which == "input":
            got, want = fused(x.as_subclass(_Scaled)), model(x.as_subclass(_Scaled))
        else:
            conv = _conv_of(model)
            conv.weight = nn.Parameter(conv.weight.detach().as_subclass(_Scaled))
            got, want = fused(x), model(x)
    assert len(launched) == 2 and not torch.isnan(got).any()
    _close(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))
    assert fused.plans[0].last_path == "torch"


def test_torch_jit_script_scripts_the_models_own_ops():
    """torch.jit.script of a fused model (and of a model holding one) gives a ScriptModule of the model's own ops, with
    a warning: the original's answers, also after a weight update (shared parameters)."""
    torch.manual_seed(5)
    model = Backbone().eval()
    fused = fullfuse.fused_model(model)
    x, v = torch.randn(2, 3, 20, 20), torch.randn(2, 4, 5, 5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # (torch.jit.script's own, on newer torch)
        with pytest.warns(UserWarning, match="own ops"):
            scripted = torch.jit.script(fused)
        outer = nn.Sequential(nn.Identity(), fullfuse.fused_model(SeedA(8, 6).eval()))
        with pytest.warns(UserWarning, match="own ops"):
            scripted_outer = torch.jit.script(outer)
    with torch.no_grad():
        for got, want in zip(scripted(x, v), model(x, v)):
            _close(got, want)
        model.head[0].weight.mul_(2)
        for got, want in zip(scripted(x, v), model(x, v)):
            _close(got, want)
        y = torch.randn(2, 8, 9, 9)
        _close(scripted_outer(y), outer[1](y))
        branchy = _ScriptableBranchy().eval()
        with pytest.warns(UserWarning, match="own ops"):
            scripted_branchy = torch.jit.script(fullfuse.fused_model(branchy))
        _close(scripted_branchy(y), branchy(y))


class _AsksScripting(nn.Module):
    """torchvision's Inception and GoogLeNet pattern: a script returns another result than an eager call."""

    def __init__(self, where: str):
        super().__init__()
        self.head, self.where = _Head(), where

    def forward(self, x):
        if self.where == "root":
            y = self.head(x)
            return y * 2 if torch.jit.is_scripting() else y
        return self.head(x) + self.tail(x)

    def tail(self, x):
        return torch.ones(1) if torch.jit.is_scripting() else torch.zeros(1)


@pytest.mark.parametrize("where", ["root", "method"])
def test_a_forward_asking_is_scripting_scripts_as_the_model(where):
    """fx's trace takes the eager branch of ``torch.jit.is_scripting()`` (its answer there is an eager call's: the
    model fuses), a script of the model the other: torch.jit.script of the fused model scripts the model itself."""
    torch.manual_seed(16)
    model = _AsksScripting(where).eval()
    fused = fullfuse.fused_model(model)
    assert len(fused.plans) == 1
    y = torch.randn(2, 8, 9, 9)
    with torch.no_grad():
        _close(fused(y), model(y))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scripted, scripted_fused = torch.jit.script(model), torch.jit.script(fused)
        want = scripted(y)
        _close(want, model(y) * 2 if where == "root" else model(y) + 1)
        _close(scripted_fused(y), want)


class _ScriptableBranchy(nn.Module):
    """fx cannot trace it (a branch on a tensor's value), TorchScript can: its fused part scripts as its own ops."""

    def __init__(self):
        super().__init__()
        self.head = _Head()

    def forward(self, x):
        if bool(x.sum() > -1e9):
            x = x + 0
        return self.head(x)


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 6, 3)
        self.out_features = 6

    def forward(self, x):
        return F.gelu(self.conv(x)).mean((2, 3))


class _Untraceable(nn.Module):
    """Data-dependent control flow (fx cannot trace it), an attribute and a class test of its children, its own
    parameter and buffer, fusable pipelines in a child that traces (A, B) and in a child that does not (B)."""

    def __init__(self):
        super().__init__()
        self.head = _Head()
        self.up = SeedB(4, 6, 3, 2, 1)
        self.branchy = nn.ModuleList([SeedB(4, 6, 3, 2, 1), nn.Identity()])
        self.fc = nn.Linear(6, 3)
        self.scale = nn.Parameter(torch.tensor(2.0))
        self.register_buffer("shift", torch.tensor(0.5))

    def forward(self, x, v):
        if x.sum() > -1e9:
            x = x + 0
        assert self.head.out_features == 6 and isinstance(self.up, SeedB)
        b = self.branchy[0](v) if v.sum() > -1e9 else v
        return self.fc(self.head(x)) * self.scale + self.shift, self.up(v), self.branchy[1](b)


def test_untraceable_model_gets_its_traceable_parts_fused(monkeypatch):
    """A model fx cannot trace: its children that trace and hold a pipeline run fused (the kernel path is stubbed:
    NaN where a region runs it), inside copies of the model's modules, so its own forward finds their attributes and
    classes, its hooks and theirs fire (also hooks registered after), its state dict keeps its names both ways, copies
    work, and the user's model is unchanged."""
    import copy
    import io
    launched = _stub_kernel_path(monkeypatch)
    torch.manual_seed(0)
    model = _Untraceable().eval()
    fired = []
    hooks = [model.head.register_forward_hook(lambda m, a, out: fired.append(("head", type(m).__name__)))]
    fused = fullfuse.fused_model(model)
    assert [p.name for p in fused.plans] == ["head.fullfuse_region_0", "up.fullfuse_region_0",
                                             "branchy.0.fullfuse_region_0"]
    assert all(str(plan) in repr(fused) for plan in fused.plans)
    hooks.append(model.register_forward_hook(lambda m, a, out: fired.append(("root", type(m).__name__))))
    x, v = torch.randn(2, 8, 9, 9), torch.randn(2, 4, 5, 5, 5)
    with torch.no_grad():
        assert all(torch.isnan(out).all() for out in fused(x, v))
        assert fired == [("head", "_Head"), ("root", "_Untraceable")]
        launched.stubbed = False
        monkeypatch.setattr(calls, "_registry", {})
        fused = fullfuse.fused_model(model)
        for got, want in zip(fused(x, v), model(x, v)):
            _close(got, want)
        assert [p.last_path for p in fused.plans] == ["torch"] * 3   # (CPU inputs)
    assert type(model.head) is _Head and type(model.up) is SeedB and isinstance(model.branchy, nn.ModuleList)
    assert list(fused.state_dict()) == list(model.state_dict())
    new = {k: torch.randn_like(t) for k, t in model.state_dict().items()}
    fused.load_state_dict(new)
    assert all(torch.equal(model.state_dict()[k], t) for k, t in new.items())
    model.load_state_dict(fused.state_dict())
    for hook in hooks:   # (lambdas: they would not pickle)
        hook.remove()
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    with torch.no_grad():
        for twin in (copy.deepcopy(fused), torch.load(buffer, weights_only=False)):
            for got, want in zip(twin(x, v), model(x, v)):
                _close(got, want)


class _OptionalInputs(nn.Module):
    """Optional inputs (None or a bool by default) that switch branches, positional, by name and keyword-only."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 6, 3)
        self.gate = nn.Conv2d(8, 8, 1)   # (only the branch for a given mask calls it)

    def forward(self, x, mask=None, scale=2.0, *, labels=None, features=False):
        if mask is not None:
            x = x * self.gate(mask)
        if features:
            return F.gelu(self.conv(x))
        y = F.gelu(self.conv(x)).mean((2, 3)) * scale
        if labels is not None:
            return y, (y - labels).pow(2).mean()
        return y


def test_optional_inputs_give_the_models_answer(monkeypatch):
    """fx traced a forward's None-default inputs as proxies, keeping the branch for a given value, which a call
    without it then ran (a TypeError on `x * None`), and failed on a branch on a bool input.  They are traced as their
    defaults now, and a call that gives some of them another value runs a graph traced for that (on its first such
    call; a proxy for a None default, the other bool for a bool one), fused where a region matches there (the kernel
    path stubbed: NaN), else the model's own forward (a bool input given a value that is no bool too): every call
    gives the model's answer."""
    launched = _stub_kernel_path(monkeypatch)
    torch.manual_seed(0)
    model = _OptionalInputs().eval()
    x = torch.randn(2, 8, 9, 9)
    mask, labels = torch.rand_like(x), torch.randn(2, 6)
    defaults = [((x,), {}), ((x, None), {}), ((x,), {"mask": None}), ((x,), {"labels": None, "scale": 3.0}),
                ((x, None, 4.0), {}), ((x,), {"features": False})]
    given = [((x, mask), {}), ((x,), {"mask": mask}), ((x,), {"labels": labels}), ((x, mask, 3.0), {"labels": None}),
             ((x, mask), {"labels": labels, "features": False})]
    unfused = [((x,), {"features": True}), ((x, mask), {"features": 1})]   # (no region there; no bool)
    with torch.no_grad():
        fused = fullfuse.fused_model(model)
        for args, kwargs in defaults + given:
            out = fused(*args, **kwargs)
            assert all(torch.isnan(o).all() for o in (out if isinstance(out, tuple) else (out,))), (len(args), kwargs)
        for args, kwargs in unfused:
            _close(fused(*args, **kwargs), model(*args, **kwargs))
        assert sorted(p.name for p in fused.plans) == ["fullfuse_region_0", "fullfuse_region_0 (labels given)",
                                                       "fullfuse_region_0 (labels, mask given)",
                                                       "fullfuse_region_0 (mask given)"]
        launched.stubbed = False
        monkeypatch.setattr(calls, "_registry", {})
        fused = fullfuse.fused_model(model)
        for args, kwargs in defaults + given + unfused:
            got, want = fused(*args, **kwargs), model(*args, **kwargs)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                _close(g, w)
        assert "optional input" in fused.plans[0].last_reason
        fused.double().train(False)   # (reaches the modules only the given-mask branch calls)
        assert model.gate.weight.dtype == torch.float64
        _close(fused(x.double(), mask.double()), model(x.double(), mask.double()))


@pytest.mark.skipif(not hasattr(torch.compiler, "is_exporting"), reason="torch without torch.compiler.is_exporting")
@pytest.mark.parametrize("family", ["A", "B"])
def test_export_records_pytorchs_ops_and_compile_the_fused_op(family):
    """torch.export (strict and not) records PyTorch's ops for a region, so the exported program runs without fullfuse
    (ONNX, AOTInductor); torch.compile's graph holds the region as one torch.ops.fullfuse op."""
    model, x = _small_seed(family)
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        for strict in (True, False):
            program = torch.export.export(fused, (x,), strict=strict)
            targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
            assert not any("fullfuse" in t for t in targets) and any("conv" in t for t in targets), targets
            _close(program.module()(x), model(x))
        seen = []

        def backend(gm, inputs):
            seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            return gm.forward
        _close(torch.compile(fused, backend=backend, fullgraph=True)(x), model(x))
    assert any(t.startswith("fullfuse.") for t in seen), seen


def _seed_a_viewed(post: str, out_channels: int = 6) -> nn.Module:
    """Seed A's ops (8 input channels, 3x3) whose pool is followed by ``post``: the seed's own squeeze() or
    nn.Flatten()."""
    if post == "squeeze":
        return SeedA(8, out_channels).eval()
    return nn.Sequential(nn.Conv2d(8, out_channels, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()


@pytest.mark.skipif(not hasattr(torch.compiler, "is_exporting"), reason="torch without torch.compiler.is_exporting")
@pytest.mark.parametrize("post", ["squeeze", "flatten"])
def test_a_dynamic_batch_stays_dynamic_through_the_regions_ops(post):
    """torch.export with a dynamic batch dim records the region's PyTorch ops without specializing the batch (traces
    get the ops as written, not a signature's folded ones), strict and not; torch.compile(dynamic=True) traces them
    where autograd needs them, at a batch of 1 too (squeeze() drops it, as the model's own view); torch.jit.trace's
    graph keeps the model's shape at other batch sizes."""
    torch.manual_seed(0)
    model = _seed_a_viewed(post)
    fused = fullfuse.fused_model(model)
    assert fused.plans[0].spec.post == post
    batch = torch.export.Dim("batch")
    for strict in (True, False):
        with torch.no_grad():
            program = torch.export.export(fused, (torch.randn(3, 8, 9, 9),), dynamic_shapes=(({0: batch},),),
                                          strict=strict)
        for n in (2, 5):
            x = torch.randn(n, 8, 9, 9)
            got = program.module()(x)
            assert got.shape == model(x).shape
            _close(got, model(x))
    compiled = torch.compile(fused, backend="eager", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the one-time warning that autograd runs PyTorch's ops)
        for n in (1, 2, 5):
            x = torch.randn(n, 8, 9, 9)
            got = compiled(x)
            assert got.shape == model(x).shape
            _close(got.detach(), model(x).detach())
    with torch.no_grad():
        traced = torch.jit.trace(fused, torch.randn(2, 8, 9, 9))   # (recorded at a batch of 2, run at others)
        for n in (1, 3):
            x = torch.randn(n, 8, 9, 9)
            assert traced(x).shape == model(x).shape


@pytest.mark.parametrize("post", ["squeeze", "flatten"])
@pytest.mark.parametrize("out_channels", [6, 1])
def test_each_signatures_torch_ops_keep_the_models_shape(post, out_channels):
    """A signature's prepared PyTorch ops (here: CPU inputs) fold the post view into the pool for its batch size: a
    batch of 1 and one output channel, which squeeze() drops, and others, each call its own signature."""
    torch.manual_seed(0)
    model = _seed_a_viewed(post, out_channels)
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        for n in (1, 2, 1, 3):
            x = torch.randn(n, 8, 9, 9)
            got, want = fused(x), model(x)
            assert got.shape == want.shape and got.stride() == want.stride()
            _close(got, want)


def test_torch_device_context_keeps_the_kernel_path(monkeypatch):
    """`with torch.device(...)` (a torch function mode that only sets factories' default device) leaves a region on its
    kernel path (stubbed: NaN)."""
    launched = _stub_kernel_path(monkeypatch)
    model, x = _small_seed("A")
    fused = fullfuse.fused_model(model)
    with torch.no_grad(), torch.device("cpu"):
        assert torch.isnan(fused(x)).all() and torch.isnan(fused(x)).all() and len(launched) == 2


def test_a_fused_model_with_optional_inputs_pickles_without_the_models_hooks():
    """The original module a call with an optional input runs is kept without the root's hooks (its forward runs
    none): a hook that does not pickle on the original model does not keep the fused model from pickling.  Loading it
    leaves torch.fx able to trace (fx's guard of an argument traced as None broke every later trace once unpickled)."""
    import io
    model = _OptionalInputs().eval()
    model.register_forward_hook(lambda m, a, out: None)
    fused = fullfuse.fused_model(model)
    x = torch.randn(2, 8, 9, 9)
    with torch.no_grad():
        fused(x, torch.ones_like(x))   # (a graph for a given mask, its plan: traced again by a copy)
        buffer = io.BytesIO()
        torch.save(fused, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert len(fused.plans) == 2 and len(loaded.plans) == 1
        _close(loaded(x, torch.ones_like(x)), model(x, torch.ones_like(x)))
        assert [p.name for p in loaded.plans] == [p.name for p in fused.plans]
    assert len(fullfuse.fused_model(SeedA(8, 6).eval()).plans) == 1


def test_optional_inputs_under_torch_compile():
    """torch.compile (fullgraph) of a fused model called with an optional input: the model's own forward where the
    graph for that input is not made yet (dynamo does not trace fx's tracing), that graph once an eager call made it.
    (torch 2.4's dynamo fails on the model's own forward there: README, versions.)"""
    if torch.__version__ < "2.5":
        pytest.skip("torch 2.4's dynamo cannot compile the model's own forward of a fused model (README)")
    torch.manual_seed(0)
    model = _OptionalInputs().eval()
    fused = fullfuse.fused_model(model)
    x = torch.randn(2, 8, 9, 9)
    mask = torch.rand_like(x)
    with torch.no_grad():
        _close(torch.compile(fused, backend="aot_eager", fullgraph=True)(x, mask), model(x, mask))
        assert len(fused.plans) == 1
        fused(x, mask)
        assert len(fused.plans) == 2
        _close(torch.compile(fused, backend="aot_eager", fullgraph=True)(x, mask), model(x, mask))


class _NoGradForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 6, 3)

    @torch.no_grad()
    def forward(self, x):
        return F.gelu(self.conv(x)).mean((2, 3))


class _InferenceForward(_NoGradForward):
    @torch.inference_mode()
    def forward(self, x):
        return F.gelu(self.conv(x)).mean((2, 3))


@pytest.mark.parametrize("model_class", [_NoGradForward, _InferenceForward])
def test_a_forward_under_a_grad_mode_decorator_keeps_it(monkeypatch, model_class):
    """fx records no grad-mode change: a forward under @torch.no_grad() / @torch.inference_mode() lost it, so with
    grad on (parameters that require grad) a region ran PyTorch's ops with autograd, unfused, its output requiring grad
    where the model's does not.  The fused graph runs in the forward's mode now: the kernel path (stubbed: NaN), an
    output without grad (an inference tensor under inference_mode).  A model fused inside `torch.no_grad()` keeps
    the caller's mode."""
    launched = _stub_kernel_path(monkeypatch)
    torch.manual_seed(0)
    model = model_class()
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    out, want = fused(x), model(x)
    assert torch.isnan(out).all() and len(launched) == 1
    assert not out.requires_grad and out.is_inference() == want.is_inference()
    plain = SeedA(8, 6)
    with torch.no_grad():
        fused_plain = fullfuse.fused_model(plain)
    y = torch.randn(2, 8, 9, 9)
    assert fused_plain(y).requires_grad and plain(y).requires_grad


class _FrozenFeatures(nn.Module):
    """A frozen conv pipeline under `with torch.no_grad():` inside forward, a trainable head after it (``across``:
    the block ends inside the pipeline, before its pool)."""

    def __init__(self, across: bool = False, inference: bool = False, fail: bool = False):
        super().__init__()
        self.conv, self.head = nn.Conv2d(8, 6, 3), nn.Linear(6, 3)
        self.across, self.inference, self.fail = across, inference, fail

    def forward(self, x):
        with torch.inference_mode() if self.inference else torch.no_grad():
            y = F.gelu(self.conv(x))
            if not self.across:
                y = y.mean((2, 3))
            if self.fail:
                y = y.view(5, 7)
        if self.across:
            y = y.mean((2, 3))
        return self.head(y.clone())


def _grads(model, out):
    model.zero_grad(set_to_none=True)
    out.sum().backward()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["block", "across", "inference"])
def test_a_grad_mode_block_inside_forward_is_kept(monkeypatch, kind):
    """fx records no grad-mode change: a `with torch.no_grad():` block inside forward ran in the caller's mode, so with
    grad on the frozen conv got gradients (an optimizer would update it) and its region ran PyTorch's ops with autograd.
    The fused graph turns grad off around the block now: the same output and gradients as the model (none for the
    conv), the region on the kernel path (stubbed: NaN), also where the block ends inside the pipeline; the caller's
    mode is back after the call."""
    torch.manual_seed(0)
    model = _FrozenFeatures(across=kind == "across", inference=kind == "inference")
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    assert len(fused.plans) == 1
    want, out = model(x), fused(x)
    _close(out, want)
    assert out.requires_grad and torch.is_grad_enabled()
    got, expected = _grads(model, out), _grads(model, want)
    assert got["conv.weight"] is None and got["conv.bias"] is None
    for name in ("head.weight", "head.bias"):
        _close(got[name], expected[name])
    with torch.no_grad():
        _close(fused(x), want)
        assert not torch.is_grad_enabled()
    launched = _stub_kernel_path(monkeypatch)
    fused = fullfuse.fused_model(model)
    assert torch.isnan(fused(x)).all() and len(launched) == 1


def test_a_grad_mode_block_gives_the_callers_mode_back_where_it_raises():
    torch.manual_seed(0)
    fused = fullfuse.fused_model(_FrozenFeatures(fail=True))
    with pytest.raises(RuntimeError, match="invalid"):
        fused(torch.randn(2, 8, 9, 9))
    assert torch.is_grad_enabled()


def test_a_grad_mode_block_survives_pickling_and_later_traces_still_work():
    """A pickled GraphModule is traced again from its code when loaded: the block's calls must be recorded there (a
    call fx does not record would run once at load time and vanish), and the loaded code must not break later traces
    in the process."""
    import io
    torch.manual_seed(0)
    model = _FrozenFeatures()
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    for _ in range(2):   # (a loaded model pickled again)
        buffer = io.BytesIO()
        torch.save(fused, buffer)
        buffer.seek(0)
        fused = torch.load(buffer, weights_only=False)
    out = fused(x)
    _close(out, model(x))
    fused.zero_grad(set_to_none=True)
    out.sum().backward()
    assert fused.graph_module.fullfuse_region_0.conv.weight.grad is None
    assert fused.graph_module.head.weight.grad is not None
    torch.fx.symbolic_trace(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    other = fullfuse.fused_model(SeedA(8, 6))
    assert len(other.plans) == 1 and other(x).shape == (2, 6)


def test_a_grad_mode_block_under_torchscript_and_torch_compile():
    """TorchScript cannot compile the block's calls: the scripted own ops run without them, and the warning says so;
    torch.compile keeps them."""
    torch.manual_seed(0)
    model = _FrozenFeatures()
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    with pytest.warns(UserWarning, match="grad-mode and autocast blocks run in the caller's modes"):
        scripted = torch.jit.script(fused)
    _close(scripted(x), model(x))
    torch._dynamo.reset()
    compiled = torch.compile(fused, backend="eager")
    out = compiled(x)
    _close(out, model(x))
    assert _grads(model, out)["conv.weight"] is None


class _RootTensors(nn.Module):
    """Tensors the forward reads by attribute: a root Parameter and buffer, one of a plain submodule (fx copies each
    into its graph), an optional input (a second graph)."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(8, 6, 3), nn.Linear(6, 2)
        self.scale = nn.Parameter(torch.tensor(2.0))
        self.register_buffer("shift", torch.zeros(2))
        self.head = nn.Module()
        self.head.w = nn.Parameter(torch.ones(2))

    def forward(self, x, mask=None):
        y = self.fc(F.gelu(self.conv(x)).mean((2, 3)) * self.scale) + self.shift
        if mask is not None:
            y = y * mask
        return y * self.head.w


class _UntraceableHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.head, self.bias = _ScaledHead(), nn.Parameter(torch.zeros(6))

    def forward(self, x):
        return self.head(x) + self.bias if x.sum() > 0 else self.head(x) - self.bias


class _ScaledHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.scale = nn.Conv2d(8, 6, 3), nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return F.gelu(self.conv(x)).mean((2, 3)) * self.scale


def _swapped(model, names):
    return {name: torch.randn_like(value) for name, value in names(model)}


@pytest.mark.parametrize("kind", ["graph", "optional input given", "untraceable", "fused submodule"])
def test_functional_call_with_either_models_names(kind):
    """torch.func.functional_call swaps tensors in by name: the state dict's (the original model's) names set a
    root-level one as an attribute, which landed on the fused model unseen by its graph — a silent wrong answer —
    and a nested one raised AttributeError.  Both the original's and the fused model's own names (named_parameters) give
    the original's answer now, and the fused model is as it was after the call."""
    torch.manual_seed(0)
    original = {"graph": _RootTensors, "optional input given": _RootTensors, "untraceable": _UntraceableHead,
                "fused submodule": _RootTensors}[kind]()
    x = torch.randn(2, 8, 9, 9)
    args = (x, torch.randn(2)) if kind == "optional input given" else (x,)
    if kind == "fused submodule":
        model = nn.Sequential(original)
        fused = nn.Sequential(fullfuse.fused_model(original))
    else:
        model, fused = original, fullfuse.fused_model(original)
    assert list(fused.state_dict()) == list(model.state_dict())
    before = fused(*args)
    by_state = _swapped(model, lambda m: m.state_dict().items())
    _close(torch.func.functional_call(fused, by_state, args), torch.func.functional_call(model, by_state, args))
    own = {**dict(fused.named_parameters()), **dict(fused.named_buffers())}
    state_name = {id(v): k for k, v in model.state_dict(keep_vars=True).items()}
    by_own = {name: torch.randn_like(value) for name, value in own.items()}
    _close(torch.func.functional_call(fused, by_own, args),
           torch.func.functional_call(model, {state_name[id(v)]: by_own[k] for k, v in own.items()}, args))
    _close(fused(*args), before)


def test_the_original_models_attribute_names_on_the_fused_model():
    """The fused model answers to the original's attribute names with the same objects; a Parameter or buffer assigned
    later, on either model, reaches the fused graph (one entry for both); a module the graph calls can be replaced
    on the fused model; one a region took in cannot (the error says to fuse again)."""
    torch.manual_seed(0)
    model = _RootTensors()
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    assert fused.fc is model.fc and fused.conv is model.conv and fused.scale is model.scale
    assert fused.head.w is model.head.w and fused.shift is model.shift
    model.scale = nn.Parameter(torch.tensor(5.0))
    _close(fused(x), model(x))
    fused.shift = torch.full((2,), 3.0)
    assert model.shift[0] == 3.0
    _close(fused(x), model(x))
    mask = torch.randn(2)
    _close(fused(x, mask=mask), model(x, mask=mask))   # (the graph traced for a given mask)
    with pytest.raises(AttributeError, match="call fused_model again"):
        fused.conv = nn.Conv2d(8, 6, 3)
    plain = SeedA(8, 6)
    head = nn.Sequential(plain, nn.Linear(6, 2))
    fused_head = fullfuse.fused_model(head)
    setattr(fused_head, "1", nn.Linear(6, 2))
    _close(fused_head(x), nn.Sequential(plain, getattr(fused_head, "1"))(x))
    with pytest.raises(AttributeError):
        fused.no_such_attribute


class _Flags(nn.Module):
    """None-default flags a call gives as constants (a branch on each), and one that is a value (``scale``)."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(8, 6, 3), nn.Linear(6, 2)

    def forward(self, x, mode=None, repeat=None, return_dict=None, scale=None):
        y = F.gelu(self.conv(x)).mean((2, 3))
        for _ in range(repeat or 1):
            y = y * 1.5
        if scale is not None:
            y = y * scale
        if mode == "features":
            return y
        out = self.fc(y)
        return {"logits": out} if return_dict else out


_FLAG_CALLS = [((), {"mode": "features"}), ((), {"repeat": 3}), ((), {"return_dict": True}),
               (("features", 2), {}), ((), {"scale": 2.0, "return_dict": False})]


@pytest.mark.parametrize("args,kwargs", _FLAG_CALLS)
def test_a_none_default_flag_given_a_constant_is_traced_for_it(monkeypatch, args, kwargs):
    """A None-default input given a bool, int or str (`return_dict=True`, `mode="features"`) was traced as a proxy, on
    which a branch fails to trace: the call ran the model's own forward, unfused.  The graph is traced for the value
    now: the region on the kernel path (stubbed: NaN), the model's answer with the real path, the value in the plan's
    name; past FusedModel.GRAPH_LIMIT graphs the model's own forward serves."""
    torch.manual_seed(0)
    model = _Flags().requires_grad_(False)
    x = torch.randn(2, 8, 9, 9)

    def first(out):
        return out["logits"] if isinstance(out, dict) else out
    _close(first(fullfuse.fused_model(model)(x, *args, **kwargs)), first(model(x, *args, **kwargs)))
    launched = _stub_kernel_path(monkeypatch)
    fused = fullfuse.fused_model(model)
    assert torch.isnan(first(fused(x, *args, **kwargs))).all() and len(launched) == 1
    assert fused.plans[-1].name.endswith(" given)") and len(fused.plans) == 2
    monkeypatch.setattr(fullfuse.FusedModel, "GRAPH_LIMIT", 1)
    _close(fused(x, repeat=7), model(x, repeat=7))   # (a second pattern: past the limit)
    assert len(launched) == 1 and len(fused.plans) == 2


class _AutocastBlock(nn.Module):
    """A conv pipeline under `with torch.autocast(...)` inside forward (``kind``): a bfloat16 block, a float32 block
    (autocast off inside the caller's), one inside the other, a block ending inside the pipeline, a forward decorated
    with @torch.autocast, a block whose op raises.  Returns the block's output as it is."""

    def __init__(self, kind: str):
        super().__init__()
        self.conv, self.kind = nn.Conv2d(8, 6, 3), kind

    def forward(self, x):
        kind = self.kind
        if kind == "bfloat16 block":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.gelu(self.conv(x)).mean((2, 3))
        if kind == "float32 block":
            with torch.autocast("cpu", enabled=False):
                return F.gelu(self.conv(x.float())).mean((2, 3))
        if kind == "nested":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = self.conv(x).sum()
                with torch.autocast("cpu", enabled=False):
                    y = F.gelu(self.conv(x.float())).mean((2, 3))
                return y + z
        if kind == "across":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = F.gelu(self.conv(x))
            return y.mean((2, 3))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.gelu(self.conv(x)).mean((2, 3)).view(5, 7)


class _AutocastForward(_AutocastBlock):
    @torch.autocast("cpu", dtype=torch.bfloat16)
    def forward(self, x):
        return F.gelu(self.conv(x)).mean((2, 3))


@pytest.mark.parametrize("kind", ["bfloat16 block", "float32 block", "nested", "across", "decorated"])
@pytest.mark.parametrize("outer", [False, True], ids=["plain call", "under autocast"])
def test_an_autocast_block_inside_forward_is_kept(monkeypatch, kind, outer):
    """fx records no autocast context: a block's ops (and its regions) computed in the caller's precision — a bfloat16
    block returned float32, a float32 block inside the caller's autocast bfloat16.  The fused graph enters and exits
    the forward's contexts now: the model's dtype and values, the caller's autocast state after the call, and a pickled
    graph keeps them; a region across a block's edge is left to PyTorch's ops; the region inside a block runs its
    call path (stubbed: NaN)."""
    import io
    torch.manual_seed(0)
    model = (_AutocastForward if kind == "decorated" else _AutocastBlock)(kind).requires_grad_(False)
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    assert len(fused.plans) == (0 if kind == "across" else 1)
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    for candidate in (fused, torch.load(buffer, weights_only=False)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=outer):
            got, want = candidate(x), model(x)
            assert torch.is_autocast_enabled("cpu") == outer
        assert got.dtype == want.dtype and torch.equal(got, want)
    if kind != "across":
        launched = _stub_kernel_path(monkeypatch)
        assert torch.isnan(fullfuse.fused_model(model)(x)).all() and len(launched) >= 1


def test_an_autocast_block_gives_the_callers_state_back_where_it_raises():
    fused = fullfuse.fused_model(_AutocastBlock("raises"))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="invalid"):
            fused(torch.randn(2, 8, 9, 9))
        assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()


def test_an_autocast_block_under_torchscript_and_torch_compile():
    torch.manual_seed(0)
    model = _AutocastBlock("bfloat16 block").requires_grad_(False)
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    with pytest.warns(UserWarning, match="autocast blocks run in the caller's modes"):
        scripted = torch.jit.script(fused)
    assert scripted(x).dtype == torch.float32   # (TorchScript drops the block, as the warning says)
    torch._dynamo.reset()
    out = torch.compile(fused, backend="eager")(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, model(x))


class _NoGradForwardWithAutocast(_AutocastBlock):
    @torch.no_grad()
    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.gelu(self.conv(x)).mean((2, 3)).view(5, 7)


def test_a_grad_mode_forward_with_an_autocast_block_gives_the_callers_state_back_where_it_raises():
    fused = fullfuse.fused_model(_NoGradForwardWithAutocast("raises"))
    with pytest.raises(RuntimeError, match="invalid"):
        fused(torch.randn(2, 8, 9, 9))
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()


class _WithFusedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.head, self.fc = nn.Conv2d(3, 8, 3, padding=1), SeedA(8, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.fc(self.head(F.relu(self.stem(x))))


def test_torch_fx_keeps_a_fused_part_as_one_call(monkeypatch):
    """torch.fx's own tracers (a user's symbolic_trace, FX quantization's prepare_fx, feature extraction) traced into a
    fused model held by a larger one, where the region's per-call tests on traced values raised TraceError.  They keep
    it as one module call now: the traced graph runs it, on the kernel path (stubbed: NaN); the class (and pickling)
    is unchanged."""
    import copy
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import prepare_fx
    torch.manual_seed(0)
    model = _WithFusedHead().eval().requires_grad_(False)
    x = torch.randn(2, 3, 9, 9)
    held = copy.deepcopy(model)
    held.head = fullfuse.fused_model(held.head)
    traced = torch.fx.symbolic_trace(held)
    assert [n.target for n in traced.graph.nodes if n.op == "call_module"] == ["stem", "head", "fc"]
    _close(traced(x), model(x))
    prepared = prepare_fx(copy.deepcopy(held), get_default_qconfig_mapping(), (x,))
    assert prepared(x).shape == (2, 2)
    assert type(held.head).__module__ == "fullfuse.model"
    launched = _stub_kernel_path(monkeypatch)
    held.head = fullfuse.fused_model(model.head)
    assert torch.isnan(torch.fx.symbolic_trace(held)(x)).all() and len(launched) == 1


class _HeldHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.head, self.scale = SeedA(8, 6), 2.0

    def forward(self, x):
        return self.head(x)


def _scaled_forward(self, x):
    return self.head(x) * self.scale


@pytest.mark.parametrize("how", ["bound method", "partial"])
def test_a_forward_set_on_the_instance_runs(monkeypatch, how):
    """fx traces the class's forward: a forward set on the model instance (a patched method; accelerate's hooks set a
    partial) was passed over, a silent wrong answer.  Such a model runs its own forward now, on a copy whose fused
    parts serve it (the kernel path, stubbed: NaN)."""
    import functools
    import types
    torch.manual_seed(0)
    model = _HeldHead().requires_grad_(False)
    model.forward = (types.MethodType(_scaled_forward, model) if how == "bound method"
                     else functools.partial(_scaled_forward, model))
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    _close(fused(x), model(x))
    assert [plan.name for plan in fused.plans] == ["head.fullfuse_region_0"]
    launched = _stub_kernel_path(monkeypatch)
    assert torch.isnan(fullfuse.fused_model(model)(x)).all() and len(launched) == 1


def test_the_original_models_own_hooks_run_around_the_fused_graph(monkeypatch):
    """Hooks on the model itself (a pre-hook changing its input, a hook changing its output) were lost: the traced
    graph runs none of them, a silent wrong answer.  They run around the fused graph now (also ones added to the model
    later; each gets a module of the model's class), the graph on the kernel path (stubbed: NaN); hooks on the fused
    model are its own; a pickled fused model runs none of the model's."""
    import io
    torch.manual_seed(0)
    model = nn.Sequential(SeedA(8, 6), nn.Linear(6, 2)).requires_grad_(False)
    seen = []
    model.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    fused = fullfuse.fused_model(model)
    x = torch.randn(2, 8, 9, 9)
    _close(fused(x), model(x))
    model.register_forward_hook(lambda m, args, out: seen.append(type(m)) or out + 1)
    _close(fused(x), model(x))
    assert seen == [nn.Sequential, nn.Sequential]
    fused.register_forward_hook(lambda m, args, out: out * 0)
    assert not fused(x).any() and model(x).any()
    loaded = torch.load(io.BytesIO(_saved(fullfuse.fused_model(nn.Sequential(SeedA(8, 6))))), weights_only=False)
    assert loaded(x).shape == (2, 6)
    launched = _stub_kernel_path(monkeypatch)
    hooked = nn.Sequential(SeedA(8, 6)).requires_grad_(False)
    hooked.register_forward_hook(lambda m, args, out: out)
    assert torch.isnan(fullfuse.fused_model(hooked)(x)).all() and len(launched) == 1


def _saved(module) -> bytes:
    import io
    buffer = io.BytesIO()
    torch.save(module, buffer)
    return buffer.getvalue()


class _SetsAttributes(nn.Module):
    """A forward that keeps its features and counts its calls on the module."""

    def __init__(self):
        super().__init__()
        self.head, self.calls = SeedA(8, 6), 0
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.features = y = self.head(x)
        self.calls += 1
        self.steps += 1
        return y * 2


def test_a_forward_that_sets_module_attributes(monkeypatch):
    """Tracing ran the forward on the user's model, which left fx's traced values there (`model.features` a Proxy,
    `calls` counted once, the buffer a Proxy), and the traced graph never set them.  The model is put back as it was
    and runs its own forward over copies with fused parts (the kernel path, stubbed: NaN): the fused model's
    attributes are what the forward set, the buffer is the model's."""
    torch.manual_seed(0)
    model = _SetsAttributes().requires_grad_(False)
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    assert "features" not in vars(model) and model.calls == 0 and type(model.steps) is torch.Tensor
    _close(fused(x), model(x))
    assert fused.calls == 1 and model.calls == 1 and model.steps == 2
    _close(fused.features, model.features)
    assert [plan.name for plan in fused.plans] == ["head.fullfuse_region_0"]
    launched = _stub_kernel_path(monkeypatch)
    fused = fullfuse.fused_model(model)
    assert torch.isnan(fused(x)).all() and len(launched) == 1


class _ReadsTraining(nn.Module):
    """A forward that reads its training flag (F.dropout(..., self.training), a branch on it)."""

    def __init__(self):
        super().__init__()
        self.head, self.fc = SeedA(8, 6), nn.Linear(6, 2)

    def forward(self, x):
        y = F.dropout(self.head(x), 0.5, self.training)
        if self.training:
            y = y * 10
        return self.fc(y)


class _UntraceableAround(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _ReadsTraining()

    def forward(self, x):
        return self.inner(x) if x.sum() > 0 else -self.inner(x)


@pytest.mark.parametrize("where", ["root", "submodule", "fused part"])
@pytest.mark.parametrize("fused_in", ["train", "eval"])
def test_a_training_flag_read_by_the_forward_follows_train_and_eval(monkeypatch, where, fused_in):
    """fx bakes a training flag the forward reads into the graph: a model fused in train mode (a new model's mode) kept
    dropout and the training branch after `.eval()`, and one fused in eval mode dropped them after `.train()` — silent
    wrong answers.  A call whose flags differ from the traced ones runs a graph traced for them (listed in `.plans`),
    the region on the kernel path (stubbed: NaN) in eval mode; train mode gives the model's own random answer."""
    torch.manual_seed(0)
    model = {"root": _ReadsTraining, "submodule": lambda: nn.Sequential(_ReadsTraining()),
             "fused part": _UntraceableAround}[where]().requires_grad_(False)
    x = torch.randn(2, 8, 9, 9).abs()
    model.train(fused_in == "train")
    fused = fullfuse.fused_model(model)
    for mode in ("eval", "train", "eval"):
        getattr(fused, mode)()
        getattr(model, mode)()
        assert fused.training == model.training
        torch.manual_seed(1)
        got = fused(x)
        torch.manual_seed(1)
        _close(got, model(x))
    launched = _stub_kernel_path(monkeypatch)
    model.train(fused_in == "train")
    fused = fullfuse.fused_model(model).eval()
    assert torch.isnan(fused(x)).all() and len(launched) == 1


_SEEN_ELSEWHERE = []


class _ReadsTrainingFromAnotherThread(_ReadsTraining):
    """Its forward, while traced, has another thread read its training flag and a leaf's (as a thread running the same
    modules would)."""

    def forward(self, x):
        import threading
        probe = threading.Thread(target=lambda: _SEEN_ELSEWHERE.extend([type(self.training), type(self.fc.training)]))
        probe.start()
        probe.join()
        return super().forward(x)


def test_a_trace_shows_recording_training_flags_to_its_own_thread_only():
    """The trace notes the training flags it reads through the classes of the modules it traces through; another
    thread (running the same modules meanwhile) reads plain bools, as does every leaf module, whose flag the graph
    reads when it runs (F.dropout, batch norm take only a bool)."""
    _SEEN_ELSEWHERE.clear()
    model = _ReadsTrainingFromAnotherThread().eval()
    fused = fullfuse.fused_model(model)
    assert _SEEN_ELSEWHERE == [bool, bool]
    assert "training" not in vars(_ReadsTrainingFromAnotherThread) and "training" not in vars(nn.Linear)
    assert fused.__dict__["_traced_training"] == (False,)


class _Together(nn.Module):
    """A frozen pipeline (optionally under autocast), dropout reading the training flag, optional inputs, a root-level
    parameter and buffer: the failure classes above, in one forward."""

    def __init__(self, frozen: bool, autocast: bool, dropout: bool):
        super().__init__()
        self.head, self.fc = SeedA(8, 6), nn.Linear(6, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("shift", torch.randn(3))
        self.frozen, self.autocast, self.dropout = frozen, autocast, dropout

    def forward(self, x, mask=None, mode=None):
        with torch.no_grad() if self.frozen else torch.enable_grad():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                y = self.head(x)
        y = y.float()
        if self.dropout:
            y = F.dropout(y, 0.3, self.training)
        if mask is not None:
            y = y * mask
        out = self.fc(y) * self.scale + self.shift
        return out / 2 if mode == "half" else out


def test_the_failure_classes_together_give_the_models_answer():
    """Every combination of a frozen block, an autocast block, dropout on the training flag, optional inputs given, a
    hook on the model, fusing in train or eval mode, calling in train or eval mode and with grad on or off (and
    pickled, without the hook): the fused model's output, dtype, requires_grad and gradients are the model's."""
    import io
    import itertools
    for frozen, autocast, dropout, given, hook, fused_in, called_in, grad in itertools.product(*[(False, True)] * 8):
        torch.manual_seed(0)
        model = _Together(frozen, autocast, dropout).train(fused_in)
        if hook:
            model.register_forward_hook(lambda m, args, out: out - 1)
        fused = fullfuse.fused_model(model)
        if not hook and frozen == grad:   # (pickled: a copy with its parameters, against a model with them)
            fused = torch.load(io.BytesIO(_saved(fused)), weights_only=False)
            model = _Together(frozen, autocast, dropout)
            model.load_state_dict(fused.state_dict())
        fused.train(called_in)
        model.train(called_in)
        x = torch.randn(2, 8, 9, 9)
        kwargs = {"mask": torch.randn(6), "mode": "half"} if given else {}
        with torch.enable_grad() if grad else torch.no_grad():
            torch.manual_seed(5)
            got = fused(x, **kwargs)
            torch.manual_seed(5)
            want = model(x, **kwargs)
        case = (frozen, autocast, dropout, given, hook, fused_in, called_in, grad)
        assert got.dtype == want.dtype and got.requires_grad == want.requires_grad, case
        _close(got, want)
        if want.requires_grad:
            for g, w in zip(*(torch.autograd.grad(out.sum(), [m.head.conv.weight, m.fc.weight, m.scale],
                                                  allow_unused=True) for out, m in ((got, fused), (want, model)))):
                assert (g is None) == (w is None), case
                if g is not None:
                    _close(g, w)


class _WithHead(nn.Module):
    """Seed A's pipeline (conv, GELU, pool) in ``body``, then a linear head: modules to re-assign at three depths."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(8, 6, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("where", ["head", "body", "body.0", "body.1"])
def test_a_module_reassigned_on_the_model_after_fused_model(monkeypatch, where):
    """A module re-assigned on the model after fused_model (a new head, a whole block, the conv, the activation): the
    fused graph holds the one it replaced, so the fused model runs the model's own forward (PyTorch's answer, with a
    warning naming the module and the fix) until it is put back, then the kernel path again (stubbed: NaN).  A deep
    copy made before is a model of its own: it keeps its modules and its kernel path."""
    launched = _stub_kernel_path(monkeypatch)
    torch.manual_seed(0)
    model, x = _WithHead().eval(), torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    copied = copy.deepcopy(fused)
    parent_path, _, name = where.rpartition(".")
    parent = model.get_submodule(parent_path)
    old = parent._modules[name]
    new = {"head": nn.Linear(6, 3), "body": nn.Sequential(nn.Conv2d(8, 6, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                                          nn.Flatten()),
           "body.0": nn.Conv2d(8, 6, 3, padding=1), "body.1": nn.SiLU()}[where].eval()
    with torch.no_grad():
        assert torch.isnan(fused(x)).all() and len(launched) == 1
        setattr(parent, name, new)
        with pytest.warns(UserWarning, match=f"'{where}' was re-assigned, added or deleted after fused_model.*"
                                             f"fused_model\\(model\\)"):
            got = fused(x)
        torch.testing.assert_close(got, model(x))
        assert fused.plans[0].last_path == "torch" and len(launched) == 1
        assert torch.isnan(copied(x)).all() and len(launched) == 2
        setattr(parent, name, old)
        assert torch.isnan(fused(x)).all() and len(launched) == 3


@pytest.mark.parametrize("copied", [False, True])
def test_an_autocast_block_under_torch_compile_where_dynamo_cannot_trace_the_graphs(monkeypatch, copied):
    """Where torch.compile cannot trace the graph's autocast calls (torch 2.11 and older put torch.amp._enter_autocast
    in the graph as an op and assert that the global autocast state changed), the forward's own `with` block runs,
    in the block's precision; a deep copy too."""
    from fullfuse import mode_blocks
    monkeypatch.setattr(mode_blocks, "compile_cannot_trace", lambda gm: True)
    torch.manual_seed(0)
    model = _AutocastBlock("bfloat16 block").requires_grad_(False)
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    if copied:
        fused = copy.deepcopy(fused)
    torch._dynamo.reset()
    out = torch.compile(fused, backend="eager", fullgraph=True)(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, model(x))


@pytest.mark.parametrize("change", ["appended", "deleted", "parametrized"])
def test_a_module_added_to_or_deleted_from_the_model_after_fused_model(monkeypatch, change):
    """A Sequential whose forward runs every child: one appended or deleted after fused_model runs the model's own
    forward (the graph has the children as they were), with a warning, until it is as it was; a parametrization
    registered on the conv since (children of a module that had none) keeps the kernel path (stubbed: NaN)."""
    launched = _stub_kernel_path(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 6, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))
    x = torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model.eval())
    with torch.no_grad():
        if change == "parametrized":
            torch.nn.utils.parametrizations.weight_norm(model[0])
            assert torch.isnan(fused(x)).all() and len(launched) == 1
            return
        if change == "appended":
            model.append(nn.Tanh())
        else:
            last = model[4]
            del model[4]
        with pytest.warns(UserWarning, match=f"'{5 if change == 'appended' else 4}' was re-assigned, added or "
                                             f"deleted"):
            got = fused(x)
        torch.testing.assert_close(got, model(x))
        assert not launched
        if change == "appended":
            del model[5]   # (Sequential's `del` puts a new dict of children on it)
        else:
            model.append(last)
        assert torch.isnan(fused(x)).all() and len(launched) == 1


class _Doubled(nn.Module):
    """A custom module fx traces through (its ops, not its call, go into the graph)."""

    def forward(self, x):
        return x * 2


class _TracedThrough(nn.Module):
    """Seed A's pipeline in a Sequential (fx traces through it) with a custom activation (traced through too), a
    head after, and a module nothing calls."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(8, 6, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.scale = _Doubled()
        self.head = nn.Linear(6, 3)
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.head(self.scale(self.body(x)))


def _double(module, inputs, output):
    return output * 2


@pytest.mark.parametrize("where", ["body", "scale"])
@pytest.mark.parametrize("change", ["forward hook", "forward pre-hook", "hook with kwargs", "backward hook",
                                    "instance forward", "hook removed", "instance forward deleted", "hooks reordered",
                                    "hook dict replaced"])
def test_a_hook_or_forward_on_a_traced_through_module_after_fused_model(monkeypatch, where, change):
    """fx traces into a Sequential or a custom module: the graph holds their ops and the hooks and instance forward
    they had, not their calls.  A hook registered on one after fused_model, one removed since, a forward set on the
    instance or deleted, its hooks run in another order, its hook dict replaced by another: the fused model runs the
    model's own forward (PyTorch's answer, with a warning naming the module and the fix) until the module is as it
    was, then the kernel path (stubbed: NaN) again."""
    launched = _stub_kernel_path(monkeypatch)
    torch.manual_seed(0)
    model, x = _TracedThrough().eval(), torch.randn(2, 8, 9, 9)
    module = getattr(model, where)
    before = None
    if change == "hook removed":
        before = module.register_forward_hook(_double)
    elif change == "instance forward deleted":
        module.forward = lambda *args: type(module).forward(module, *args) * 3
    elif change == "hooks reordered":
        first, second = module.register_forward_hook(_double), module.register_forward_hook(lambda m, i, out: out + 1)
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        assert torch.isnan(fused(x)).all() and len(launched) == 1
        if change == "forward hook":
            handle = module.register_forward_hook(_double)
        elif change == "forward pre-hook":
            handle = module.register_forward_pre_hook(lambda m, inputs: (inputs[0] * 3,))
        elif change == "hook with kwargs":
            handle = module.register_forward_hook(lambda m, args, kwargs, out: out + 1, with_kwargs=True)
        elif change == "backward hook":
            handle = module.register_full_backward_hook(lambda m, grad_in, grad_out: None)
        elif change == "hooks reordered":   # (the graph doubles, then adds 1; the model now the other way round)
            module._forward_hooks.move_to_end(first.id)
            handle = type("Handle", (), {"remove": lambda self: module._forward_hooks.move_to_end(second.id)})()
        elif change == "hook dict replaced":
            hooks, module._forward_hooks = module._forward_hooks, type(module._forward_hooks)({-1: _double})
            handle = type("Handle", (), {"remove": lambda self: setattr(module, "_forward_hooks", hooks)})()
        elif change == "instance forward":
            module.forward = lambda *args: torch.zeros(2, 6)
            handle = type("Handle", (), {"remove": lambda self: module.__dict__.pop("forward")})()
        elif change == "hook removed":
            before.remove()
            handle = type("Handle", (), {"remove": lambda self: None})()
        else:
            forward = module.__dict__.pop("forward")
            handle = type("Handle", (), {"remove": lambda self: setattr(module, "forward", forward)})()
        with pytest.warns(UserWarning, match=f"'{where}' \\(traced through.*got other hooks or another forward after "
                                             f"fused_model.*fused_model\\(model\\)"):
            got = fused(x)
        assert torch.equal(got, model(x)) and not torch.isnan(got).any()
        assert fused.plans[0].last_path == "torch" and len(launched) == 1
        if change == "hook removed":
            before = module.register_forward_hook(_double)   # (another hook: as the graph has it, but not the same)
            assert torch.equal(fused(x), model(x)) and len(launched) == 1   # (warned once per change)
            before.remove()
            return
        handle.remove()
        assert torch.isnan(fused(x)).all() and len(launched) == 2


class _Settings(nn.Module):
    """Seed A's pipeline, then a scale read from the root's attribute and a shift from a custom module's (fx bakes
    both into the graph as constants)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(8, 6, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.scale = 2.0
        self.shift = _Shift()

    def forward(self, x):
        return self.shift(self.body(x) * self.scale)


class _Shift(nn.Module):
    def __init__(self):
        super().__init__()
        self.by, self.dims = 1.0, [1]
        self.offset = torch.zeros(6)   # (a plain tensor attribute, not a buffer: fx keeps this object in the graph)

    def forward(self, x):
        return x + self.by * len(self.dims) + self.offset


@pytest.mark.parametrize("change", ["root's float", "traced-through module's float", "a list setting's item",
                                    "a setting deleted", "the same value again", "a tensor attribute re-assigned",
                                    "a tensor attribute changed in place"])
def test_a_setting_read_as_a_constant_changed_after_fused_model(monkeypatch, change):
    """A plain attribute the traced forward read (the root's or a traced-through module's: fx bakes its value into
    the graph) set to another value after fused_model: the model's own forward runs (PyTorch's answer, with a warning
    naming it), until the value is as it was; the same value assigned again changes nothing."""
    launched = _stub_kernel_path(monkeypatch)
    torch.manual_seed(0)
    model, x = _Settings().eval(), torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    with torch.no_grad():
        assert torch.isnan(fused(x)).all() and len(launched) == 1
        if change == "the same value again":
            model.scale = 2.0
            assert torch.isnan(fused(x)).all() and len(launched) == 2
            return
        if change == "a tensor attribute changed in place":   # (the graph holds that object: it sees the change)
            model.shift.offset += 1
            launched.stubbed = False   # (a new signature, PyTorch's ops on the CPU: the values)
            x = torch.randn(3, 8, 9, 9)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert torch.equal(fused(x), model(x)) and fused.plans[0].last_reason != "stub"
            return
        if change == "root's float":
            model.scale, name = 3.0, "root module changed its setting 'scale'"
            undo = lambda: setattr(model, "scale", 2.0)  # noqa: E731
        elif change == "traced-through module's float":
            model.shift.by, undo, name = 5.0, lambda: setattr(model.shift, "by", 1.0), "'shift'.*setting 'by'"
        elif change == "a list setting's item":
            model.shift.dims.append(2)
            undo, name = model.shift.dims.pop, "'shift'.*setting 'dims'"
        elif change == "a tensor attribute re-assigned":
            offset, model.shift.offset = model.shift.offset, torch.ones(6)
            undo, name = lambda: setattr(model.shift, "offset", offset), "'shift'.*another tensor.*'offset'"
        else:
            del model.shift.by
            undo, name = lambda: setattr(model.shift, "by", 1.0), "'shift'.*setting 'by'"
        with pytest.warns(UserWarning, match=name):
            try:
                got = fused(x)
            except AttributeError as error:   # (the model's own error: its forward reads the deleted setting)
                got = error
        assert_same_answer(answer(model, x, contextlib.nullcontext), got, change)
        assert len(launched) == 1
        undo()
        assert torch.isnan(fused(x)).all() and len(launched) == 2


class _HeldSettings(_Settings):
    """_Settings whose forward also reads a dict holding a tensor the graph keeps and a function, and a list."""

    def __init__(self):
        super().__init__()
        self.table = {"offset": torch.ones(6), "root": math.sqrt, "scale": 0.5}
        self.sizes = [2, 3]

    def forward(self, x):
        y = super().forward(x)
        return y * self.table["root"](4.0) * self.table["scale"] * self.sizes[1] + self.table["offset"]


@pytest.mark.parametrize("change", ["hook on a traced-through module", "module re-assigned", "setting",
                                    "a dict's tensor", "a dict's function", "a list's item"])
def test_a_change_after_fused_model_under_torch_compile(change):
    """Under torch.compile (fullgraph: nothing may break the graph) a change after fused_model gives the model's own
    answer too, and the fused model's once the change is undone (dynamo's guards on the dicts see both).  The settings
    compared hold lists and, in a dict, a tensor and a function (torch 2.11's dynamo could not trace ``is`` of two
    lists, nor a ``Same`` of a tensor compared inside a dict)."""
    torch.manual_seed(0)
    settings = change == "setting" or change.startswith("a ")
    model, x = (_HeldSettings() if settings else _TracedThrough()).eval(), torch.randn(2, 8, 9, 9)
    compiled = torch.compile(fullfuse.fused_model(model), backend="eager", fullgraph=True)
    torch._dynamo.reset()
    with torch.no_grad():
        before = compiled(x)
        assert torch.equal(before, model(x))
        if change == "module re-assigned":
            old, model.head = model.head, nn.Linear(6, 3)
            undo = lambda: setattr(model, "head", old)  # noqa: E731
        elif change == "setting":
            model.shift.by = 4.0
            undo = lambda: setattr(model.shift, "by", 1.0)  # noqa: E731
        elif change.startswith("a dict's"):
            key, value = ("offset", torch.zeros(6)) if change == "a dict's tensor" else ("root", math.exp)
            old = model.table[key]
            model.table[key] = value
            undo = lambda: model.table.__setitem__(key, old)  # noqa: E731
        elif change == "a list's item":
            model.sizes[1] = 5
            undo = lambda: model.sizes.__setitem__(1, 3)  # noqa: E731
        else:
            undo = model.scale.register_forward_hook(_double).remove
        changed = compiled(x)
        assert torch.equal(changed, model(x)) and not torch.equal(changed, before)
        undo()
        assert torch.equal(compiled(x), model(x))


@pytest.mark.parametrize("copied", [copy.deepcopy, saved_and_loaded], ids=["deepcopy", "pickle"])
@pytest.mark.parametrize("when", ["before the change", "after the change"])
def test_a_copy_of_the_fused_model_watches_its_own_model(copied, when):
    """A copy of a fused model holds a copy of the model: a change made to it through the copy's names (a setting,
    a plain tensor, a hook on a module the trace went into) gives the changed model's answer; a copy made after its
    model had changed (the fused model then running the model's own forward) runs its model's own forward for good,
    its graph being the model's as fused.  The copy's state dict has the model's names, no more."""
    torch.manual_seed(0)
    model, x = _Settings().eval(), torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)

    def change(m):
        m.scale, m.shift.offset = 3.0, torch.ones(6)
        m.shift.register_forward_hook(_double)

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if when == "after the change":
            change(model)
            fused(x)
        fused_copy, model_copy = copied(fused), copied(model)
        assert list(fused_copy.state_dict()) == list(model_copy.state_dict())
        if when == "before the change":
            assert torch.equal(fused_copy(x), model_copy(x))
            change(fused_copy)
            change(model_copy)
        assert torch.equal(fused_copy(x), model_copy(x))
        assert fused_copy.plans[0].last_path == "torch" and "before this copy" in fused_copy.plans[0].last_reason \
            if when == "after the change" else "traced through" in fused_copy.plans[0].last_reason


def test_a_hook_on_a_module_the_forward_does_not_call_keeps_the_kernel_path(monkeypatch):
    """Only the modules the trace went into are watched: a hook on a module nothing calls changes no answer."""
    launched = _stub_kernel_path(monkeypatch)
    model, x = _TracedThrough().eval(), torch.randn(2, 8, 9, 9)
    fused = fullfuse.fused_model(model)
    model.unused.register_forward_hook(_double)
    model.head.register_forward_hook(_double)   # (a module the graph calls: its own hooks run)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.isnan(fused(x)).all() and len(launched) == 1


@pytest.mark.parametrize("on", ["fused model", "region"])
def test_a_forward_set_on_the_fused_model_or_its_region_runs(monkeypatch, on):
    """A forward set on an instance runs when the module is called, as nn.Module does (accelerate's hooks set one on
    every module of a model, a fused one too): set on the fused model or on its region, it runs instead of the kernel
    path (stubbed: NaN), which runs again once the forward is deleted."""
    launched = _stub_kernel_path(monkeypatch)
    model, x = _small_seed("A")
    fused = fullfuse.fused_model(model)
    target = fused if on == "fused model" else fused.graph_module.get_submodule("fullfuse_region_0")
    with torch.no_grad():
        target.forward = lambda *args, **kwargs: torch.zeros(1)
        assert torch.equal(fused(x), torch.zeros(1)) and not launched
        del target.forward
        assert torch.isnan(fused(x)).all() and len(launched) == 1


def test_python_m_fullfuse_is_the_command():
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "fullfuse", "--help"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert out.returncode == 0 and "{info,build,check,bench}" in out.stdout, out.stderr


def test_importing_and_a_first_call_do_not_import_torch_compile():
    """torch._dynamo takes 1.5-5 s to import: importing fullfuse, fusing a model that reads a plain tensor and its
    first calls (a tensor changed in place among them) leave it unimported, where torch's own import does."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = "\n".join([
        "import sys, torch",
        "before = 'torch._dynamo' in sys.modules",
        "import fullfuse",
        "from fullfuse.seed_models import SeedA",
        "class M(torch.nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.body, self.t = SeedA(), torch.tensor(2.0)",
        "    def forward(self, x):",
        "        return self.body(x) * self.t.item()",
        "m = M().eval()",
        "fused = fullfuse.fused_model(m)",
        "x = torch.randn(1, 8, 16, 16)",
        "with torch.no_grad():",
        "    assert torch.equal(fused(x), m(x))",
        "    m.t.add_(1.0)",
        "    assert torch.equal(fused(x), m(x))",
        "print(before, 'torch._dynamo' in sys.modules)",
    ])
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.split()
    if before == "True":
        pytest.skip("this torch imports torch._dynamo itself")
    assert after == "False"

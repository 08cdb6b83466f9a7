"""A benchmark peer, not a fullfuse path: cuDNN's own fused graph for family A
(conv_fprop -> bias -> GELU -> scale 1/(H*W) -> ADD reduction to [N, K, 1, 1]), NHWC, every plan timed, best kept.
Returns None where the cuDNN frontend is missing or offers no plan."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .fallback.cudnn_conv import data_type, fastest_plan, frontend, handle_for


def cudnn_fused_a(model: torch.nn.Module, x: torch.Tensor) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    cudnn = frontend()
    conv = getattr(model, "conv", None)
    if cudnn is None or conv is None or x.dim() != 4:
        return None
    try:
        return _build(cudnn, conv, x)
    except Exception as exc:
        print(f"  cudnn-fused-graph: no plan ({str(exc).splitlines()[0][:120]})")
        return None


def _build(cudnn, conv, x):
    io = data_type(cudnn, x.dtype)
    f32 = cudnn.data_type.FLOAT
    handle = handle_for(cudnn, x.device)
    xc = x.contiguous(memory_format=torch.channels_last)
    w = conv.weight.detach().contiguous(memory_format=torch.channels_last)
    bias = conv.bias.detach().float().view(1, -1, 1, 1).contiguous()
    n, k = x.shape[0], w.shape[0]
    out_hw = [(x.shape[2 + i] + 2 * conv.padding[i] - conv.dilation[i] * (w.shape[2 + i] - 1) - 1) // conv.stride[i] + 1
              for i in range(2)]
    scale = torch.full((1, 1, 1, 1), 1.0 / (out_hw[0] * out_hw[1]), device=x.device)
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    tx = g.tensor(name="x", dim=list(xc.shape), stride=list(xc.stride()), data_type=io)
    tw = g.tensor(name="w", dim=list(w.shape), stride=list(w.stride()), data_type=io)
    tb = g.tensor(name="b", dim=list(bias.shape), stride=list(bias.stride()), data_type=f32)
    ts = g.tensor(name="s", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
    y = g.conv_fprop(image=tx, weight=tw, padding=list(conv.padding), stride=list(conv.stride),
                     dilation=list(conv.dilation), compute_data_type=f32)
    a = g.gelu(input=g.bias(input=y, bias=tb))
    r = g.reduction(input=g.mul(a=a, b=ts), mode=cudnn.reduction_mode.ADD)
    r.set_output(True).set_dim([n, k, 1, 1]).set_stride([k, 1, k, k]).set_data_type(f32)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    out = torch.empty(n, k, device=x.device)
    pack = {tx: xc, tw: w, tb: bias, ts: scale, r: out}
    index, _, ws_bytes, _ = fastest_plan(g, pack, handle, x.device)   # raises when no plan runs
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=x.device)

    def run(inp: torch.Tensor) -> torch.Tensor:
        xin = inp.contiguous(memory_format=torch.channels_last)
        result = torch.empty(n, k, device=inp.device)
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        g.execute_plan_at_index({tx: xin, tw: w, tb: bias, ts: scale, r: result}, ws, index=index, handle=handle)
        return result.to(inp.dtype)

    return run

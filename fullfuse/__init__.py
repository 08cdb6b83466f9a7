"""fullfuse: convolution pipelines in PyTorch models as ONE fused GPU kernel.

    model = fullfuse.fused_model(model)          # same outputs; see model.plans
    y = fullfuse.ops.conv_act_pool(x, w, b)      # functional form, also torch.ops.fullfuse.conv_act_pool

Data flow: fused_model -> match -> plan -> fused | fallback | torch -> kernel launch.
"""
from . import ops
from .errors import BuildError, FullfuseError, TraceError, UnsupportedError
from .model import FusedModel, fused_model
from .spec import ConvActPoolSpec, ConvTPoolReduceSpec
from .workspace import release as empty_cache

__version__ = "0.1.0"
__all__ = ["fused_model", "FusedModel", "ops", "empty_cache", "ConvActPoolSpec", "ConvTPoolReduceSpec",
           "FullfuseError", "UnsupportedError", "TraceError", "BuildError", "__version__"]

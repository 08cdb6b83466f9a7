"""Integer codes shared by the Python side and the C launch API (mirrored in csrc/codes.h)."""

ACTIVATIONS = {"none": 0, "relu": 1, "gelu_erf": 2, "gelu_tanh": 3, "silu": 4}
POOLS = {"mean": 0, "max": 1}                       # family A: global pooling over the spatial dims
REDUCTIONS = {"sum": 0, "mean": 1, "max": 2}        # family B: reduction over the channel dim
DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}
PRECISIONS = {"tf32": 0, "ieee": 1}                 # fp32 inputs only; 16-bit inputs compute in their dtype


def dtype_code(dtype) -> int:
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"fullfuse: unsupported dtype {dtype}; expected one of float32, bfloat16, float16")
    return DTYPES[name]

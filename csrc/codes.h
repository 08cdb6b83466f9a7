// Integer codes shared with fullfuse/codes.py: keep the two files in step.
#pragma once
enum ff_activation { FF_ACT_NONE = 0, FF_ACT_RELU = 1, FF_ACT_GELU_ERF = 2, FF_ACT_GELU_TANH = 3, FF_ACT_SILU = 4 };
enum ff_pool { FF_POOL_MEAN = 0, FF_POOL_MAX = 1 };
enum ff_reduction { FF_RED_SUM = 0, FF_RED_MEAN = 1, FF_RED_MAX = 2 };
enum ff_dtype { FF_F32 = 0, FF_BF16 = 1, FF_F16 = 2 };
enum ff_precision { FF_PREC_TF32 = 0, FF_PREC_IEEE = 1 };

"""Fused path: one kernel from the input to the pooled result; the convolution output never reaches memory."""

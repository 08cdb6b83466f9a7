"""Kernel build system for fullfuse: render, compile (nvcc + ninja), cache and load the CUDA libraries."""
from .builder import (FIX, BuildError, build, build_all, cache_dir, csrc_dir, find_nvcc, library_path, load,
                      nvcc_version)
from .libraries import LIBRARIES, KernelLibrary

__all__ = ["FIX", "BuildError", "build", "build_all", "cache_dir", "csrc_dir", "find_nvcc", "library_path", "load",
           "nvcc_version", "LIBRARIES", "KernelLibrary"]

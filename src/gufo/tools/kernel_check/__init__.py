"""Read compiled GPU kernels (AMD code objects, NVIDIA cubins and their containers) without a GPU.

`read_paths` turns files into `Kernel` records; `checker` compares them with allowances or another build.
"""

from gufo.tools.kernel_check.loader import read_path, read_paths
from gufo.tools.kernel_check.model import Kernel

__all__ = ["Kernel", "read_path", "read_paths"]

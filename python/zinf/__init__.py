# SPDX-License-Identifier: Apache-2.0
"""zinf: NVMe/CPU offload for training models that do not fit in GPU memory.

The C++ core (the I/O engine, pinned memory, CPU Adam) is ``zinf._native``; the torch glue is
``zinf.torch`` and the DeepSpeed drop-in ``zinf.compat.deepspeed``. Neither links libtorch:
tensors cross as addresses, so one build serves any torch version.

Errors: an I/O failure raises :class:`zinf.IoError`, an ``OSError`` with ``errno``,
``strerror`` and ``filename`` plus ``offset``, ``length`` (bytes) and ``kind``; misuse raises
``ValueError``.
"""

from zinf._native import IoError, pinned_budget, set_pinned_budget

__version__ = "0.1.0"
__all__ = ["IoError", "pinned_budget", "set_pinned_budget", "__version__"]

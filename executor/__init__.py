"""Executor: run a Plan for real on a GGUF MoE model (torch dense path, numba CPU experts, VRAM cache)."""
import os

# torch and numba each keep an OpenMP thread pool. libgomp's default spin-wait (300k spins) lets the
# two pools, and any other busy process, steal the few cores from each other (a 2-core decode step
# ran 5x slower next to one busy process); passive waits cost ~20% on a quiet machine. A short spin
# (3k: ~23 ms vs 28 ms passive per `small` step here quiet, 47 vs 37 ms next to a busy process) is the
# compromise. Must be set before torch / numba load libgomp; the user's settings win.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "3000"

# kernels built under a switch (MOE_OFFLOAD_GEMM_INT8, ...) cache in their own folder (nbcache.use_switch_cache)
from .nbcache import use_switch_cache  # noqa: E402

use_switch_cache()

# the kernels' scratch arrays stay mapped between jobs rather than faulting in fresh pages each time (heap.py)
from .heap import keep_freed_memory  # noqa: E402

keep_freed_memory()

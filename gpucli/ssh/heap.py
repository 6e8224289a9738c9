"""Process-wide heap tuning for commands that download a lot; a choice the command makes once."""

from __future__ import annotations

import ctypes
import threading

__all__ = ["tune_heap_for_downloads"]

_lock = threading.Lock()
_tuned = False


def tune_heap_for_downloads() -> None:
    """Ask glibc to keep freed memory for reuse instead of returning it to the kernel at once.

    A download allocates and frees MiB-sized buffers (socket reads, decrypted packets) thousands of
    times; with glibc's defaults the top of the heap is trimmed and faulted in again each time:
    100k+ page faults per GiB. Measured on loopback (1 GiB, 4 interleaved runs each): 4.7-5.2 s
    -> 4.0-4.2 s, page faults 105k-162k -> 10k-14k. Peak memory is unchanged (freed memory is
    reused, not added to).

    It changes the allocator for the whole process, so it is not done inside a download: a command
    that downloads (``fetch-best``, the checkpoint mirror) calls it once before starting. Idempotent
    and thread-safe; a no-op where there is no ``mallopt`` (macOS, musl).
    """
    global _tuned
    with _lock:
        if _tuned:
            return
        _tuned = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    for param, value in ((m_mmap_threshold, 32 << 20), (m_trim_threshold, 256 << 20)):
        mallopt(param, value)

"""The web process gives freed memory back (`heap.py`): glibc keeps freed chunks in its heap, and a trim returns
their pages once the process has grown by the trimmer's threshold."""

from __future__ import annotations

import gc

import pytest

from lensapp import heap


@pytest.mark.skipif(heap._LIBC is None, reason="not glibc: nothing to trim")
def test_freed_memory_goes_back_once_the_process_has_grown():
    # What earlier tests in this process freed is trimmed first: left in glibc's free lists, it would take the new
    # pieces without the process growing (CI's whole suite: no trim, the test failed).
    heap.trim()
    trimmer = heap.Trimmer(seconds=3600, growth=32 << 20)
    before = trimmer.trims
    pieces = [bytearray(64 << 10) for _ in range(2000)]            # 128 MB in heap-sized pieces
    survivors = pieces[::16] + [pieces[-1]]                         # a few stay: the heap cannot shrink from its top
    grown = heap.resident_bytes()
    del pieces
    gc.collect()
    assert heap.resident_bytes() > grown - (32 << 20)               # freed, but glibc keeps it
    trimmer.look()
    assert trimmer.trims == before + 1 and trimmer.returned >= 64 << 20
    assert heap.resident_bytes() < grown - (64 << 20)
    trimmer.look()                                                  # not grown since: no trim
    assert trimmer.trims == before + 1 and len(survivors) == 126

"""The compiled kernels of the routing path (kvplane/_native.c), or None where they are not built.

Each kernel has a pure Python twin next to its caller (index.drop_outs(running_and(...)),
block_hash._packed, cost.price's and cost.cheapest_uncached's array
operations, cost._score_columns' loops, predictions._count_in and _count_out): the reference
that tests hold the kernel equal to, and what runs where the extension is missing (setup.py
builds it where a C compiler is present), where KVPLANE_NATIVE=0 turns it off, or inside
`turned_off()`. `status()` says which is in use and why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_native = None
_why = "built and loaded"
if os.environ.get("KVPLANE_NATIVE", "1") == "0":
    _why = "turned off by KVPLANE_NATIVE=0"
else:
    try:
        from kvplane import _native
    except ImportError as e:  # not compiled here: the Python twins run
        _why = f"not built ({e}); reinstall with a C compiler present (`make env`) for the compiled routing path"

KERNELS = ("prefix_groups", "pack_uint32", "price_rows", "cheapest_rows", "score_columns", "refs_add", "refs_remove")
prefix_groups = _native.prefix_groups if _native is not None else None
pack_uint32 = _native.pack_uint32 if _native is not None else None
price_rows = _native.price_rows if _native is not None else None
score_columns = _native.score_columns if _native is not None else None
cheapest_rows = _native.cheapest_rows if _native is not None else None
refs_add = _native.refs_add if _native is not None else None
refs_remove = _native.refs_remove if _native is not None else None


def status() -> str:
    """'compiled' or 'pure Python', and why."""
    return f"{'compiled' if _native is not None else 'pure Python'}: {_why}"


@contextlib.contextmanager
def turned_off() -> Iterator[None]:
    """The Python twins while inside (what KVPLANE_NATIVE=0 does for a whole process): to time
    both in one run (`kvplane bench routing --python-kernels`). Callers read the kernels from this
    module at each call, so the switch takes effect at once."""
    saved = {name: globals()[name] for name in KERNELS}
    globals().update(dict.fromkeys(KERNELS, None))
    try:
        yield
    finally:
        globals().update(saved)

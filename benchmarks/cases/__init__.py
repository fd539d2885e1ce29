"""The benchmark cases, one module each; importing this package registers them, in this order.

Each module's docstring says what its case measures and why its baseline is
fair; `python benchmarks/run.py --only NAME` runs one case (the names are the
`@case(...)` names, listed by `--help`).
"""

import importlib


MODULES = (
    "cached_call",  # 1  cached
    "fresh_partial",  # 2  fresh_partial
    "floor",  # 3  floor
    "uncached_call",  # 4  uncached
    "jit_trace",  # 5  jit_trace
    "scaling",  # 6  scaling
    "memory",  # 7  memory
    "carry",  # 8  carry
    "scan_carry",  # 9  scan_carry
    "cache_memory",  # 10 cache_memory
    "scale_structure_of",  # 11 scale_structure_of (group: scale)
    "scale_diff",  # 12 scale_diff (group: scale)
    "scale_memory",  # 13 scale_memory (group: scale)
    "scale_json",  # 14 scale_json (group: scale)
    "cost",  # 15 cost
    "fit",  # 16 fit
    "watch",  # 17 watch
    "scale_cached_call",  # 18 scale_cached_call (group: scale)
    "target",  # 19 target
    "timeline",  # 20 timeline
    "step_time",  # 21 step_time
)

for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")

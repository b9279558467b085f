"""kvplane's applications, the top floor: the `kvplane` CLI, benchmarks, `kvplane sim`/`plan`, the
local cluster launcher and its supervisor, and the demo. They may import both planes; nothing below
imports them (tests/test_layering.py)."""

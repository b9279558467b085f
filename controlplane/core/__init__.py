"""The control plane's core: the request planner and the algorithms it composes (cache index,
router and routing policies, latency predictor, admission policies, load accounting).

Plain Python only (standard library, numpy for the fleet's columns in pool.py, and kvplane.types,
kvplane.block_hash, kvplane.latency): no gRPC, store, clock or torch, so the algorithms are tested directly, a simulator can drive the
planner with plain data, and the runtime glue stays thin. Imports point one way (checked by
tests/core/test_core_cycles.py): views -> routing, cost -> policies -> router -> planner, and
admission_base -> each admission policy -> admission (the registry) -> planner.
"""

"""The control plane's routing core: cache index, router and admission policies.

Plain Python only (standard library plus kvplane.types / kvplane.block_hash): no gRPC, store
or torch imports, so the algorithms are tested directly and the runtime glue stays thin.
"""

"""The OpenAI-compatible HTTP face of a control plane (`kvplane controlplane --http-port`).

It is a translator, not a second server: every request becomes a `Kvplane.Generate` call on this
replica's own gRPC service (over loopback), so routing, admission, tickets, authentication and
metrics are the ones gRPC callers get. See docs/protocol.md#http-api.
"""

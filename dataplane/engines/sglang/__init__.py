"""SGLang behind the engine interface: the agent as the sidecar of an SGLang server.

plugin.py (flags, config, factory), api.py (the scheduler API's messages, pure), adapter.py (the
adapter), bootstrap.py (disaggregation through SGLang's own bootstrap rooms, pure message logic).
Tested against sglang 0.5.23 with smg-grpc-proto 0.4.28 (deploy/engines/sglang.txt).
"""

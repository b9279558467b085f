"""The vLLM adapter's configuration: the shared external-engine settings plus vLLM's own."""

from __future__ import annotations

from dataclasses import dataclass

from kvplane.dataplane.engines.external.config import ExternalEngineConfig

DEFAULT_ENDPOINT = "http://127.0.0.1:8000"
KV_CONNECTORS = ("none", "nixl")


@dataclass(frozen=True, slots=True)
class VllmConfig(ExternalEngineConfig):
    # The KV connector the server was started with (--kv-transfer-config): "nixl" = NixlConnector
    # with kv_role kv_both, so this worker can prefill for, or decode after, another vLLM worker.
    kv_connector: str = "none"

    @property
    def url(self) -> str:
        return (self.endpoint or DEFAULT_ENDPOINT).rstrip("/")

    def validate(self) -> VllmConfig:
        ExternalEngineConfig.validate(self)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the vllm engine endpoint is the server's URL, e.g. {DEFAULT_ENDPOINT}; got {self.endpoint!r}")
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"kv_connector must be one of {KV_CONNECTORS}, got {self.kv_connector!r}")
        return self

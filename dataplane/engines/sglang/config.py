"""The SGLang adapter's configuration: the shared external-engine settings plus SGLang's own."""

from __future__ import annotations

from dataclasses import dataclass

from kvplane.dataplane.engines.external.config import ExternalEngineConfig

DEFAULT_ENDPOINT = "127.0.0.1:30000"


@dataclass(frozen=True, slots=True)
class SglangConfig(ExternalEngineConfig):
    # The address the decode server's engine dials to reach this (prefill) server's bootstrap
    # server; "" = the host of the engine endpoint.
    bootstrap_host: str = ""

    @property
    def target(self) -> str:
        """host:port of the server's gRPC scheduler API."""
        return self.endpoint or DEFAULT_ENDPOINT

    def validate(self) -> SglangConfig:
        ExternalEngineConfig.validate(self)
        host, _, port = self.target.rpartition(":")
        if not host or not port.isdigit() or "://" in self.target:
            raise ValueError(f"the sglang engine endpoint is HOST:PORT of its gRPC server, e.g. {DEFAULT_ENDPOINT}; got {self.endpoint!r}")
        return self

"""Pieces shared by engines that run as their own server process (vLLM, SGLang) with the agent
as their sidecar: the KV-event wire format and its subscriber (gap detection, replay, resync),
the mapping of an engine's block hashes to kvplane's, the model's KV layout read from its
Hugging Face config, in-flight request accounting, and the engine-native KV handoff types.

Nothing here imports torch; pyzmq and msgpack (the [engines] extra) only where a socket is opened.
"""

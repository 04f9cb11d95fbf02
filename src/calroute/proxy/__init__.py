"""The router proxy: OpenAI-compatible front, vLLM NixlConnector prefill/decode handoff, live signals."""

"""The bench stage: `vllm bench serve` runs where the server's vLLM is, their saved JSON, baselines."""

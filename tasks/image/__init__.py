"""The image stage: pull by digest or build from vllm-ascend, prove every node runs the same image."""

"""The stand-in vLLM-Ascend image of the test bed (see testbed/README.md, "The stand-in image").

* `vllm_standin.py`: the `vllm` CLI stand-in (`vllm serve`), pure standard library;
* `pip_shim.py`: `pip show/list/freeze` over importlib.metadata;
* `image.py`: the image's root filesystem (Debian's Python, busybox, the stand-ins and
  their dist-info metadata), cached, imported and pushed to the bed registry.

Importing this package pulls in nothing heavy; `image` is imported by `testbed.bed`.
"""

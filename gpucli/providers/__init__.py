"""Every place a run can go: this machine, an SSH host, RunPod and vast.ai.

The shared contract and plumbing sit here (`target.py`: what a place must do and declare; `api.py`: a
cloud's offers and instances; `http.py`, `provision.py`, `offers.py`); each provider has its own folder
(`local/`, `ssh/`, `runpod/`, `vast/`) with its API client, target, clusters or overlays and billing.
Nothing outside this package names a provider: it asks the target (`registry.get_target`).
"""

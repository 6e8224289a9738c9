"""The life of a run on top of everything else: launch, resume and watch; one launch across providers and node
options; the next run on a kept machine; dev boxes; sweeps under one budget."""

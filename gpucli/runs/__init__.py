"""A run as data, below everything that acts on it: its record and state, its inputs and defaults,
the user's config, the trainer's pinned environment, notices. Nothing here rents, connects or starts.
"""

"""A machine you already have, reached over SSH."""

"""This machine as a place to run: no rental, the run's folder on the local disk."""

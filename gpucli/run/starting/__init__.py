"""Putting a run on its machines: the environment, the preflight, the job's start and watchdog, the kinds of job,
the old pod's newest checkpoint before a resume, several machines as one run."""

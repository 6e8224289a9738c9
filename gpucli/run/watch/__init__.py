"""Reading a live run from its host: metrics rows, status, raw logs, GPU use, and following it as `gpucli tail`
shows it."""

"""A run's machine as reached from here: what comes from it checked, its processes by identity, who owns it
during a launch, the layout of several machines and the link between them, hosts avoided, a command or a port
on it."""

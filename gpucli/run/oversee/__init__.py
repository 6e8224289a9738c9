"""Reading runs and doing what a read finds due: a run's own end, what status and ls show, the one reconcile
step, stopping runs and stray pods, the watcher on an always-on machine."""

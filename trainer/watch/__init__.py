"""What a run reports: metrics, alerts, TCF and the research components' watchers."""

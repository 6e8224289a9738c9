"""The alert vocabulary: every event name a run can raise and ``notifications.events`` may list.

One list for the trainer (trainer/watch/notify.py sends them), the pod's job runner for your own code
(gpucli/pod/jobrun.py, standard library only, keeps a copy that a test holds equal to this one) and the
CLI (``gpucli notify events`` prints them)."""

ALERTS: dict[str, str] = {
    "run_started": "the run's command started (your own code)",
    "checkpoint_saved": "a checkpoint was written",
    "validation_complete": "a validation pass ended, with its loss",
    "training_complete": "the run finished: step, loss, time and cost",
    "error_occurred": "the run failed, with the last lines of its log",
    "ppl_spike": "the loss (perplexity) jumped past the spike factor times its rolling mean",
    "stage_transition": "a curriculum stage began (sequence length, chunk size)",
    "cost_update": "hours and dollars so far, every notifications.cost_update_hours",
    "gate_collapse": "a memory layer's gate closed on one path (research watchers)",
    "static_memory": "a memory layer stopped changing (research watchers)",
    "refinement_order": "the refinement layers' order changed (research watchers)",
}
"""Event name -> what raises it, one line each."""

EVENTS: tuple[str, ...] = tuple(ALERTS)
"""Every event name ``notifications.events`` may list."""

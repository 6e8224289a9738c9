"""The alert vocabulary: every event name a run can raise and ``notifications.events`` may list.
One list for the trainer (trainer.watch.notify), the pod's job runner for your own code and the CLI."""

EVENTS = ("checkpoint_saved", "validation_complete", "training_complete", "error_occurred", "ppl_spike",
          "stage_transition", "cost_update", "gate_collapse", "static_memory", "refinement_order")
"""Every event name ``notifications.events`` may list."""

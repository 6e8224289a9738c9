"""What a launch is, decided before any machine is touched: its inputs and their one precedence rule, the
resolved launch, its data sources, the planner's pick, what the trainer needs, the balance guard, the script a
restarted container runs."""

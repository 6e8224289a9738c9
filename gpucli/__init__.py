"""gpucli: plan, rent, train and harvest language-model runs on rented GPUs."""

__version__ = "0.1.0"

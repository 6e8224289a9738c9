from tests.trainer.conftest import data_dir, straight_run  # noqa: F401 - the trainer tests' fixtures

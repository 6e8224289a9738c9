from tests.trainer.conftest import tiny_checkpoint  # noqa: F401 - the serving tests' checkpoint

from tests.trainer.conftest import data_dir  # noqa: F401 - the trainer benchmark smoke test prepares the same corpus

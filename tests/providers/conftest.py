pytest_plugins = ["tests.support.emulators.fixtures"]

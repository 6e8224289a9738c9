from gpucli.cli.app import entry

entry()

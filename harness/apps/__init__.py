"""The applications on top of the engine: the command line, pull-request diffs, the stored run's
files and the selftest."""

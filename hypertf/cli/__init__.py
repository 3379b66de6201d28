"""The command line: the hypertf command tree and every verb as a typed function."""

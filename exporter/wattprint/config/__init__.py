"""Settings: the one table of options, their parsers, and their command-line binding."""

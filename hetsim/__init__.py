"""The command line and reports: the layer above ``engine`` and ``sweeps``."""

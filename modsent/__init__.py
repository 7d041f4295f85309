"""modsent: modular multilingual sentence encoders.

The library behind the Snakemake workflow: every stage's logic lives here, importable and
unit-tested, with no Snakemake import. The workflow's scripts are thin wrappers around it.
"""

__version__ = "0.1.0"

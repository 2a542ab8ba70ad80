"""The package's version: in the JSON export, `attntrace --version` and `attntrace.__version__`."""

__version__ = "0.1.0"

"""The version of armorlab, defined once: the package face, the CLI, report stamps and the build read it."""

__version__ = "0.2.0"

"""CLI commands. Each module defines ``register(app)`` and imports heavy libraries only inside
the command body, so ``armorlab --help`` never loads torch or TRL."""

"""The settings, one room: the option mechanism (options.py), the core knobs (config.py), the parser (flags.py)."""

"""Failure-profile data files (TOML) read by :mod:`strategies.failures`.

``<name>.toml`` is the built-in profile ``<name>``; files starting with ``_``
are not profiles (``_responses.toml`` holds the default failure responses).
"""

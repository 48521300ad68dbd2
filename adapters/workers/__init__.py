"""Managed worker kinds: the command line that starts each, as data (gateway/supervisor.py
fills in the placeholders and runs it)."""

"""Adapters that let agent harnesses run their commands in Orchard Env sandboxes. Each module needs its
harness installed (``pip install './sdk/python[minisweagent]'`` for :mod:`.minisweagent`)."""

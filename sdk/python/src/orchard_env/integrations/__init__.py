"""Adapters that let agent harnesses run their commands in Orchard Env sandboxes. Each module needs its
harness installed (``pip install './sdk/python[minisweagent]'`` for :mod:`.minisweagent`,
``pip install './sdk/python[harbor]'`` on Python >= 3.12 for :mod:`.harbor`, and
``pip install './sdk/python[swerex]'`` for :mod:`.swerex`, SWE-ReX and so SWE-agent; docs/HARNESSES.md)."""

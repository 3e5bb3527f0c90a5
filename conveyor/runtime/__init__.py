"""Runtimes run one task per partition. Each is a plugin in the ``conveyor.runtimes`` group."""

"""Partition planners. Each is a plugin in the ``conveyor.strategies`` entry-point group."""

"""Offline generation: dataset sources, the row journal, filters and outputs, the eval fleet's
activities, and the ``generate`` / ``schedule`` commands.

The workflow itself is deterministic code in :mod:`rolloutd.workflows.generation.workflow`; it calls
the activities here by name (:class:`~rolloutd.generation.activities.GenerationActivities`).
"""

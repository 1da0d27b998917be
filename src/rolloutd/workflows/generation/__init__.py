"""The generation workflow, an offline run over a dataset's rows, workflow side.

- :mod:`~rolloutd.workflows.generation.workflow`: ``GenerationWorkflow`` (plan, run each
  row's task once, journal, continue-as-new, write the outputs);
- :mod:`~rolloutd.workflows.generation.models`: the spec, inputs, outputs and progress.

What is not workflow code lives in :mod:`rolloutd.generation`: the eval fleet's activities
(reading the dataset, the journal, the outputs) and the ``rolloutd generate`` command.
"""

"""Bridges to the trainers RL teams train with: TRL, verl, SkyRL and prime-rl's verifiers.

Each bridge is one module behind an optional extra (``pip install 'rolloutd[trl]'``, ...)
and the only place in rolloutd that imports its trainer package; import the module you need
(``rolloutd.trainer_client.bridges.trl``). :mod:`.common` holds what they share and imports
no trainer package. docs/trainers.md says who owns inference and weights in each.
"""

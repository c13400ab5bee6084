"""Bridges to other training stacks. Each submodule needs its own optional extra:
:mod:`tokenergy.integrations.trl` (``pip install 'tokenergy[trl]'``)."""

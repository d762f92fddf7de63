"""Protocol buffer stubs for the wire contracts spotgpu speaks.

The ``.proto`` files in this folder are ours, written from the documented contracts
(shared/reference/protocols.md); the ``*_pb2*.py`` modules are generated from them by
``scripts/gen_protos.py`` and committed (the test command checks they are fresh).

Importing this package imports nothing heavy; import the generated module you need, e.g.
``from spotgpu.adapters.proto import deviceplugin_v1beta1_pb2 as dp``. Decides nothing and has
no side effects: message and service definitions only.
"""

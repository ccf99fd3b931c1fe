"""The engine's face to the gateway: everything that crosses the process boundary.

Both processes import these (the contract):

- :mod:`engine.ipc.schema`: every control message, typed (msgspec structs with a tag),
  and the frame codec of the Unix control socket;
- :mod:`engine.ipc.ring`: the single-producer single-consumer ring buffers;
- :mod:`engine.ipc.shm`: the shared-memory region and its slot arena (three rings a slot);
- :mod:`engine.ipc.boundaries`: utterance boundaries published beside the audio;
- :mod:`engine.ipc.env`: the environment helpers both processes parse settings with.

Only the gateway runs this (its side of the boundary):

- :mod:`engine.ipc.client`: :class:`~engine.ipc.client.EngineClient`, one control
  connection and the streams opened over it.

The gateway's :mod:`gateway.engine_supervisor` starts, watches and restarts the engine
process and connects this client to it.

Everything else under ``engine/`` runs in the engine process, and the gateway never
imports it.
"""

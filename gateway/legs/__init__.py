"""Telephony legs: every way a call's media reaches the gateway, on one shared base.

A leg is the :class:`gateway.session.Session`'s peer for one call and a
:class:`gateway.calls.Call` in the worker's registry; :class:`gateway.legs.base.CallLeg`
owns what every leg does with its call (registering it, attach, DTMF, barge-in, marks,
flow control, hangup, release). Legs see their worker through the narrow
:class:`gateway.context.LegContext`, never the whole state.

- ``websocket/``: legs that arrive as a WebSocket on the gateway's port (Twilio, Asterisk
  chan_websocket, jambonz, FreeSWITCH), on the connection lifecycle of
  :mod:`gateway.protocols.base`;
- ``audiosocket/``: Asterisk AudioSocket, a TCP listener of its own;
- ``sip/``: the SIP bridge, a UDP listener with RTP.

Each kind is one row of :data:`gateway.legs.kinds.LEG_KINDS`: its WebSocket routes, or a
service built from the environment (its settings are read by the leg, not by
:mod:`gateway.config`). docs/architecture.md, "Adding a leg", lists the files a new one
touches.
"""

"""Asterisk AudioSocket: Asterisk opens a TCP connection per call to the gateway
(``AudioSocket()`` dialplan application, ``AudioSocket/`` channel driver, ARI
``externalMedia``; docs/telephony.md).

A connection is one more telephony leg (:class:`gateway.legs.base.CallLeg`): the sans-I/O
core ``telephony/audiosocket.py`` for the wire format, a session paced by the worker's
pacer, and an IVR application that attaches with ``start.call`` = the UUID the dialplan
gave. Off unless ``GATEWAY_AUDIOSOCKET_LISTEN`` is set.
"""

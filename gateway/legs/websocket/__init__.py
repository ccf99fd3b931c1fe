"""Telephony legs that arrive as a WebSocket on the gateway's port (Twilio, Asterisk
chan_websocket, jambonz, FreeSWITCH): each a :class:`TelephonyLeg` over its vendor's
sans-I/O core in ``telephony/``."""

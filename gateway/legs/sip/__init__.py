"""The SIP bridge: PBXs, SBCs and SIP trunks call the gateway directly (docs/telephony.md).

A SIP call is one more telephony leg (:class:`gateway.legs.base.CallLeg`): a dialog from
the sans-I/O SIP core (``telephony/sip``), an RTP stream paced by the worker's pacer, and
a route chosen by the Request-URI user that runs a flow file or waits for an IVR
application to attach. Off unless ``GATEWAY_SIP_LISTEN`` is set.
"""

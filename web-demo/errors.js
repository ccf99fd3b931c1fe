// Plain-words explanations of the gateway's error codes (docs/protocol.md, "Error
// codes") and of the page's own failures, for the alert banner. The code itself is shown
// next to the text for whoever reads the logs.

const MESSAGES = {
  // authentication: the socket closes with 1008, REST calls answer 401/403
  token_missing: [
    "Not signed in",
    "This page needs an access token. Open the link that `make run` printed " +
      "(it ends in #token=…), or paste a token under “Connection”.",
  ],
  token_malformed: [
    "The access token is not valid",
    "It is not a well-formed JWT. Copy the whole link that `make run` printed, " +
      "or paste a token under “Connection”.",
  ],
  token_expired: [
    "The access token has expired",
    "Restart `make run` for a fresh link, or mint a token with `python -m gateway token`.",
  ],
  token_invalid: [
    "The access token was rejected",
    "Its signature does not match this gateway's key. It was probably issued by another " +
      "run of the gateway: use the link printed by the one that is running now.",
  ],
  token_claims: [
    "The access token was rejected",
    "Its audience or issuer is not the one this gateway expects.",
  ],
  insufficient_scope: [
    "Not allowed",
    "The access token does not grant this (speaking needs scope tts:stream, " +
      "registering voices needs voices:write).",
  ],
  // capacity and engine
  overloaded: [
    "The gateway is busy",
    "Every synthesis slot is in use right now. Try again in a moment.",
  ],
  engine_unavailable: [
    "The speech engine is not available",
    "It is starting or restarting. Try again in a few seconds.",
  ],
  engine_error: ["Synthesis failed", "The engine could not speak this text."],
  backend_error: ["Synthesis failed", "The voice backend could not speak this text."],
  // requests
  unknown_voice: [
    "Unknown voice",
    "The gateway does not know this voice. The voice list has been refreshed: pick another one.",
  ],
  unsupported_format: ["Unsupported format", "The gateway cannot send audio in this format."],
  text_too_long: [
    "The text is too long",
    "One utterance may hold a limited number of characters. Split it into shorter prompts.",
  ],
  queue_full: [
    "Too many prompts queued",
    "Press Clear, or wait until the queued prompts have played.",
  ],
  start_timeout: ["The session timed out", "The gateway waited too long for the page to start."],
  // the page's own
  network: [
    "Cannot reach the gateway",
    "The connection failed. Check that the gateway is running and reachable.",
  ],
  timeout: ["No answer from the gateway", "The gateway did not answer in time. Try again."],
  empty_text: ["Nothing to speak", "Type a prompt or pick one of the examples first."],
  audio_unavailable: [
    "Audio playback is not available",
    "This browser could not start Web Audio playback.",
  ],
  decode_error: ["Audio could not be decoded", "The browser failed to decode the audio stream."],
  voices_unavailable: ["No voices", "The gateway returned an empty voice list."],
};

/**
 * {title, text, code} for an error: a GatewayError (with `code`) or anything thrown.
 */
export function describeError(err) {
  const code = (err && err.code) || "error";
  const known = MESSAGES[code];
  if (known) return { title: known[0], text: known[1], code };
  if (err && err.closeCode === 1013) return { title: MESSAGES.overloaded[0], text: MESSAGES.overloaded[1], code };
  const message = (err && err.message) || String(err);
  return { title: "The gateway reported an error", text: sentence(message), code };
}

function sentence(text) {
  const s = String(text).trim();
  if (!s) return "";
  return s[0].toUpperCase() + s.slice(1) + (/[.!?]$/.test(s) ? "" : ".");
}

// The gateway's APIs as the demo page uses them: the native streaming protocol
// (docs/protocol.md, `GET /v1/stream`) and the voices API (`GET`/`POST /v1/voices`).
//
// URLs are relative to the page, so the demo keeps working behind a reverse proxy that
// serves the gateway under a path prefix.

/** An error with the gateway's machine-readable code (or one the page made up). */
export class GatewayError extends Error {
  constructor(code, message, { status = 0, closeCode = 0, detail = "", fromGateway = false } = {}) {
    super(message);
    this.name = "GatewayError";
    this.code = code;
    this.status = status; // HTTP status, for the REST calls
    this.closeCode = closeCode; // WebSocket close code, for the stream
    this.detail = detail;
    this.fromGateway = fromGateway; // an `error` message of the stream (the page logged it)
  }
}

function apiUrl(path) {
  return new URL(path, document.baseURI);
}

async function errorFrom(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
    }
  } catch {
    // not JSON (aiohttp's plain-text 404/405 pages): keep the status
  }
  return new GatewayError(code, message, { status: response.status });
}

async function request(path, token, init = {}) {
  let response;
  try {
    response = await fetch(apiUrl(path), {
      ...init,
      headers: { ...(init.headers || {}), Authorization: `Bearer ${token}` },
      cache: "no-store",
    });
  } catch (err) {
    throw new GatewayError("network", "cannot reach the gateway", { detail: String(err) });
  }
  if (!response.ok) throw await errorFrom(response);
  return response.json();
}

/** `GET /v1/voices`: the voices this token may use. */
export async function listVoices(token) {
  const body = await request("v1/voices", token);
  return Array.isArray(body.voices) ? body.voices : [];
}

/**
 * `POST /v1/voices` (multipart: `audio`, optional `name`, `language` and `transcript`;
 * scope `voices:write`): register a cloned voice. Answers 201 with
 * `{id, name, language, duration_ms, kind: "cloned"}`.
 */
export async function registerVoice(token, { audio, filename, name, language, transcript }) {
  const form = new FormData();
  form.append("audio", audio, filename);
  if (name) form.append("name", name);
  if (language) form.append("language", language);
  if (transcript) form.append("transcript", transcript);
  return request("v1/voices", token, { method: "POST", body: form });
}

/**
 * One `/v1/stream` session. The voice, format and speed are fixed by `start`, so the
 * page opens a new session when one of them changes.
 *
 * Events (EventTarget): "message" (detail: a JSON message from the gateway), "audio"
 * (detail: ArrayBuffer, one codec frame), "sent" (detail: a JSON message sent),
 * "close" (detail: {code, reason, error}: error is the GatewayError that ended it, or null).
 */
export class StreamSession extends EventTarget {
  constructor(token, config) {
    super();
    this.token = token;
    this.config = config; // {voice, format, speed}
    this.ws = null;
    this.ready = null; // the `ready` message once it arrived
    this.lastError = null;
    this.closed = false;
  }

  /** A key that tells whether a session can be reused for another config. */
  static key(config) {
    return `${config.voice}|${config.format}|${config.speed}`;
  }

  get key() {
    return StreamSession.key(this.config);
  }

  get isOpen() {
    return !this.closed && this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  /**
   * Connect and send `start`; resolves with `ready`, rejects with a GatewayError.
   * Browsers cannot set headers on a WebSocket: the token goes in `access_token`,
   * which the gateway redacts from its access log.
   */
  open(timeoutMs = 10_000) {
    const url = apiUrl("v1/stream");
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.searchParams.set("access_token", this.token);
    return new Promise((resolve, reject) => {
      let settled = false;
      const settle = (fn, value) => {
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          fn(value);
        }
      };
      const timer = setTimeout(() => {
        settle(reject, new GatewayError("timeout", "the gateway did not answer `start` in time"));
        this.abort();
      }, timeoutMs);

      const ws = new WebSocket(url);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      ws.onopen = () => {
        this.send({
          type: "start",
          voice: this.config.voice,
          format: this.config.format,
          speed: this.config.speed,
          pacing: "burst", // the page buffers: let the gateway send ahead (bounded)
        });
      };
      ws.onmessage = (event) => {
        if (typeof event.data !== "string") {
          this.dispatchEvent(new CustomEvent("audio", { detail: event.data }));
          return;
        }
        let msg;
        try {
          msg = JSON.parse(event.data);
        } catch {
          return;
        }
        if (msg.type === "ready") {
          this.ready = msg;
          settle(resolve, msg);
        } else if (msg.type === "error") {
          this.lastError = new GatewayError(msg.code, msg.message || msg.code, {
            detail: msg.utterance_id ? `utterance ${msg.utterance_id}` : "",
            fromGateway: true,
          });
        }
        this.dispatchEvent(new CustomEvent("message", { detail: msg }));
      };
      ws.onclose = (event) => {
        this.closed = true;
        // The error message, if any, arrived just before the close frame.
        let error = null;
        if (event.code !== 1000) {
          error =
            this.lastError ||
            new GatewayError(event.code === 1006 ? "network" : `close_${event.code}`,
              event.reason || "the connection to the gateway closed", { closeCode: event.code });
          error.closeCode = event.code;
        }
        settle(reject, error || new GatewayError("closed", "the gateway closed the session"));
        this.dispatchEvent(
          new CustomEvent("close", { detail: { code: event.code, reason: event.reason, error } }),
        );
      };
      ws.onerror = () => {
        // Always followed by a close event, which reports it.
      };
    });
  }

  send(msg) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      throw new GatewayError("not_connected", "the session is not connected");
    }
    this.ws.send(JSON.stringify(msg));
    this.dispatchEvent(new CustomEvent("sent", { detail: msg }));
  }

  speak(text, utteranceId) {
    this.send({ type: "speak", text, utterance_id: utteranceId });
  }

  mark(name) {
    this.send({ type: "mark", name });
  }

  clear() {
    this.send({ type: "clear" });
  }

  /** Polite close: the gateway finishes what is queued and closes with 1000. */
  close() {
    if (this.isOpen) this.send({ type: "close" });
  }

  /** Close now, without waiting for queued audio. */
  abort() {
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, "page closed");
  }
}

/** The claims of a JWT, decoded without checking it (the gateway checks it). */
export function peekClaims(token) {
  try {
    const payload = token.split(".")[1];
    const binary = atob(payload.replace(/-/g, "+").replace(/_/g, "/"));
    const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    return claims && typeof claims === "object" ? claims : null;
  } catch {
    return null;
  }
}

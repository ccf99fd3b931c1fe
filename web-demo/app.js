// The demo page: wires the text box, the pickers and the buttons to a `/v1/stream`
// session and the audio player, and shows what happens (latency, level, protocol events).
//
// Sign-in: `make run` prints http://HOST:PORT/#token=JWT. The fragment never leaves the
// browser; the page keeps the token in sessionStorage and removes it from the address bar.
//
// For tests, window.__demo exposes live counters (see `demo` below).

import { AudioPlayer, FORMATS, opusSupported } from "./audio-player.js";
import { describeError } from "./errors.js";
import { GatewayError, StreamSession, listVoices, peekClaims } from "./gateway-client.js";
import { PROMPTS, voiceSpeaks } from "./prompts.js";
import { VoiceLab } from "./voice-lab.js";

const TOKEN_KEY = "ivr-demo-token";
const PREFS_KEY = "ivr-demo-prefs";
const IDLE_CLOSE_MS = 120_000; // close an unused session after 2 minutes
const LOG_LIMIT = 300; // lines in the protocol log
const HISTORY_LIMIT = 30; // utterances in the history list
// The English voice a new user hears: the neural one when the engine has it.
const PREFERRED_VOICES = ["en-us-joe", "en-us"];
const DEFAULT_VOICE = "en-us"; // used until the voice list has loaded
const DEFAULT_LANGUAGES = ["en-US", "zh-CN", "zh-HK"];

const $ = (id) => document.getElementById(id);
const el = {
  status: $("status"),
  identity: $("identity"),
  alert: $("alert"),
  alertTitle: $("alert-title"),
  alertText: $("alert-text"),
  alertCode: $("alert-code"),
  alertClose: $("alert-close"),
  examples: $("examples"),
  text: $("text"),
  charCount: $("char-count"),
  voice: $("voice"),
  format: $("format"),
  formatNote: $("format-note"),
  speed: $("speed"),
  speedValue: $("speed-value"),
  speak: $("speak"),
  clear: $("clear"),
  latency: $("latency"),
  latencyServer: $("latency-server"),
  buffered: $("buffered"),
  audioLength: $("audio-length"),
  wave: $("wave"),
  meter: $("meter"),
  meterFill: $("meter-fill"),
  stats: {
    received: $("stat-received"),
    decoded: $("stat-decoded"),
    scheduled: $("stat-scheduled"),
    path: $("stat-path"),
  },
  history: $("history"),
  historyEmpty: $("history-empty"),
  log: $("log"),
  logClear: $("log-clear"),
  tokenInput: $("token-input"),
  tokenForm: $("token-form"),
  tokenForget: $("token-forget"),
  connectionInfo: $("connection-info"),
  connection: $("connection"),
};

// ---- counters for tests and for the stats panel ---------------------------------------------

const player = new AudioPlayer({
  onDrained: () => updateState(),
  onError: (err) => showError(new GatewayError("decode_error", String(err))),
});

/** Live counters. Player counters are getters, so a test always reads current values. */
const demo = {
  state: "starting", // signed-out | idle | connecting | speaking | error
  packetsReceived: 0, // binary frames received (every format)
  framesDropped: 0, // frames that arrived after a Clear and were discarded
  utterancesStarted: 0,
  utterancesDone: 0,
  lastFirstAudioMs: null, // page-measured: speak sent (or head of queue) -> first frame
  lastServerFirstAudioMs: null, // the gateway's first_audio_ms
  errorsShown: 0,
  lastErrorCode: null,
  clears: 0,
  clearedAcks: 0,
  marks: 0,
  sessionsOpened: 0,
  voices: [],
  opus: null, // WebCodecs Opus support, once known
  registry: "unknown", // voice registry: unknown | available | unavailable
  voicesRegistered: 0,
  get packetsDecoded() {
    return player.packetsDecoded;
  },
  get samplesScheduled() {
    return player.samplesScheduled;
  },
  get samplesPlayed() {
    return player.samplesPlayed;
  },
  maxLevel: 0, // the loudest peak the output analyser has seen (0..1)
  get queuedMs() {
    return Math.round(player.queuedSeconds * 1000);
  },
  get output() {
    return player.outputKind;
  },
  get audioContext() {
    return player.contextState;
  },
  get format() {
    return session ? session.config.format : el.format.value;
  },
};
window.__demo = demo;

// ---- page state --------------------------------------------------------------------------

let token = "";
let session = null; // the current StreamSession
let opening = null; // the StreamSession being opened, until `ready` or failure
let discarding = false; // between sending `clear` and receiving `cleared`
let utteranceSeq = 0;
const utterances = new Map(); // id -> {id, text, voice, status, sentAt, ...}
let current = null; // the utterance whose frames are arriving
let idleTimer = 0;

function setState(state) {
  demo.state = state;
  const labels = {
    "signed-out": "Not signed in",
    idle: "Ready",
    connecting: "Connecting…",
    speaking: "Speaking",
    error: "Error",
  };
  el.status.dataset.state = state;
  el.status.textContent = labels[state] || state;
}

/** Speaking while an utterance is unfinished or audio is queued; else ready. */
function updateState() {
  if (demo.state === "error" || demo.state === "signed-out" || opening) return;
  const pending = [...utterances.values()].some((u) => u.status === "queued" || u.status === "playing");
  setState(pending || player.queuedSeconds > 0.02 ? "speaking" : "idle");
  scheduleIdleClose();
}

// ---- the alert banner and the event log --------------------------------------------------------

/** Text with `code` spans, built without innerHTML. */
function richText(target, text) {
  target.replaceChildren();
  String(text)
    .split("`")
    .forEach((part, i) => {
      if (!part) return;
      if (i % 2) {
        const code = document.createElement("code");
        code.textContent = part;
        target.append(code);
      } else {
        target.append(part);
      }
    });
}

function showError(err) {
  const { title, text, code } = describeError(err);
  el.alertTitle.textContent = title;
  richText(el.alertText, text);
  el.alertCode.textContent = code;
  el.alert.hidden = false;
  demo.errorsShown++;
  demo.lastErrorCode = code;
  // The gateway's own error messages are in the log already, as they arrived.
  if (!(err && err.fromGateway)) log("error", `${code}: ${err && err.message ? err.message : title}`);
  // A token problem: open the panel where another token can be pasted.
  if (/^token_|^insufficient_scope$/.test(code)) el.connection.open = true;
}

function hideError() {
  el.alert.hidden = true;
}

const timeFormat = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  hour12: false,
});

/**
 * One line in the protocol log. kind: "in" (from the gateway), "out" (to it), "info",
 * "error". `type` is the message type, shown as a tag.
 */
function log(kind, text, type = "") {
  const li = document.createElement("li");
  li.className = `log-${kind}`;
  const now = new Date();
  const time = document.createElement("time");
  time.dateTime = now.toISOString();
  time.textContent = `${timeFormat.format(now)}.${String(now.getMilliseconds()).padStart(3, "0")}`;
  const dir = document.createElement("span");
  dir.className = "log-dir";
  dir.textContent = { in: "←", out: "→", error: "!", info: "•" }[kind] || "•";
  dir.title = { in: "from the gateway", out: "to the gateway", error: "error", info: "page" }[kind];
  li.append(time, dir);
  if (type) {
    const tag = document.createElement("span");
    tag.className = "log-type";
    tag.textContent = type;
    li.append(tag);
  }
  const body = document.createElement("span");
  body.className = "log-text";
  body.textContent = text;
  li.title = type ? `${type} ${text}` : text; // lines are cut to fit: the whole line on hover
  li.append(body);
  const atBottom = el.log.scrollHeight - el.log.scrollTop - el.log.clientHeight < 24;
  el.log.append(li);
  while (el.log.childElementCount > LOG_LIMIT) el.log.firstElementChild.remove();
  if (atBottom) el.log.scrollTop = el.log.scrollHeight;
}

/** A short description of a gateway message for the log (never the token). */
function describeMessage(msg) {
  switch (msg.type) {
    case "ready":
      return `session ${msg.session_id} · ${msg.format} · ${msg.sample_rate / 1000} kHz · ${msg.frame_ms} ms frames`;
    case "utterance_started":
      return msg.utterance_id;
    case "utterance_done":
      return `${msg.utterance_id} · ${(msg.audio_ms / 1000).toFixed(2)} s of audio · first audio ${msg.first_audio_ms} ms (server)`;
    case "mark":
      return `${msg.name}${msg.cleared ? " · dropped by clear" : " · played"}`;
    case "error":
      return `${msg.code}: ${msg.message}${msg.utterance_id ? ` (${msg.utterance_id})` : ""}`;
    case "start":
      return `voice ${msg.voice} · ${msg.format} · speed ${msg.speed} · ${msg.pacing} pacing`;
    case "speak":
      return `${msg.utterance_id} “${msg.text.length > 60 ? msg.text.slice(0, 57) + "…" : msg.text}”`;
    default: {
      const { type: _type, ...rest } = msg;
      const keys = Object.keys(rest);
      return keys.length ? JSON.stringify(rest) : "";
    }
  }
}

// ---- token and identity ----------------------------------------------------------------------

function readToken() {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromUrl = hash.get("token");
  if (fromUrl) {
    sessionStorage.setItem(TOKEN_KEY, fromUrl);
    // Keep the token out of the address bar, bookmarks and screen shares.
    history.replaceState(null, "", location.pathname + location.search);
    return fromUrl;
  }
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function showIdentity() {
  const claims = token ? peekClaims(token) : null;
  if (!token) {
    el.identity.textContent = "";
    el.connectionInfo.textContent = "No token. Open the link that make run printed, or paste a token.";
    return;
  }
  if (!claims) {
    el.identity.textContent = "";
    el.connectionInfo.textContent = "The token is not a readable JWT.";
    return;
  }
  const who = claims.tenant ? `${claims.sub} · ${claims.tenant}` : String(claims.sub || "?");
  let expiry = "";
  if (typeof claims.exp === "number") {
    const minutes = Math.round((claims.exp * 1000 - Date.now()) / 60000);
    expiry =
      minutes <= 0
        ? "expired"
        : minutes < 120
          ? `expires in ${minutes} min`
          : `expires in ${Math.round(minutes / 60)} h`;
  }
  el.identity.textContent = [who, expiry].filter(Boolean).join(" · ");
  el.connectionInfo.textContent =
    `Signed in as ${claims.sub}` +
    (claims.tenant ? ` (tenant ${claims.tenant})` : "") +
    `; scopes: ${claims.scope || "none"}` +
    (expiry ? `; ${expiry}.` : ".");
}

async function useToken(newToken) {
  token = newToken.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  retireSession();
  hideError();
  showIdentity();
  if (!token) {
    setState("signed-out");
    showError(new GatewayError("token_missing", "no token"));
    return;
  }
  setState("idle");
  await loadVoices();
}

// ---- voices --------------------------------------------------------------------------------

const languageNames = new Intl.DisplayNames(["en"], { type: "language" });

function languageLabel(tag) {
  try {
    return languageNames.of(tag);
  } catch {
    return tag;
  }
}

/** Fill the picker: built-in voices by language, then cloned voices. */
function fillVoices(voices, selectId) {
  const previous = selectId || el.voice.value;
  el.voice.replaceChildren();
  if (voices.length === 0) {
    el.voice.append(new Option("No voices: sign in first", "", true, true));
  }
  const groups = new Map();
  for (const v of voices) {
    const group = v.kind === "cloned" ? "Your voices" : languageLabel(v.language);
    if (!groups.has(group)) groups.set(group, []);
    groups.get(group).push(v);
  }
  const ordered = [...groups.keys()].sort((a, b) =>
    a === "Your voices" ? 1 : b === "Your voices" ? -1 : 0,
  );
  for (const name of ordered) {
    const optgroup = document.createElement("optgroup");
    optgroup.label = name;
    for (const v of groups.get(name)) {
      const option = new Option(`${v.name || v.id} (${v.id})`, v.id);
      option.dataset.language = v.language || "";
      optgroup.append(option);
    }
    el.voice.append(optgroup);
  }
  const ids = voices.map((v) => v.id);
  const preferred = PREFERRED_VOICES.find((id) => ids.includes(id));
  el.voice.value = ids.includes(previous) ? previous : preferred || ids[0] || "";
  el.voice.disabled = voices.length === 0;
  demo.voices = ids;
  const languages = [...new Set(voices.map((v) => v.language).filter(Boolean))];
  voiceLab.setLanguages(languages.length ? languages : DEFAULT_LANGUAGES, selectedVoiceLanguage());
}

function selectedVoiceLanguage() {
  const option = el.voice.selectedOptions[0];
  return option ? option.dataset.language : "";
}

let localVoices = []; // registered here, kept even if the list does not show them yet

async function loadVoices(selectId) {
  try {
    const voices = await listVoices(token);
    const known = new Set(voices.map((v) => v.id));
    const merged = [...voices, ...localVoices.filter((v) => !known.has(v.id))];
    fillVoices(merged, selectId || savedPrefs().voice);
    log("in", `${voices.length} voices`, "GET /v1/voices");
    if (voices.length === 0) showError(new GatewayError("voices_unavailable", "empty voice list"));
    return true;
  } catch (err) {
    log("error", `${err.status || ""} ${err.code}`, "GET /v1/voices");
    if (demo.voices.length === 0) fillVoices([]);
    showError(err);
    setState(err.code === "token_missing" ? "signed-out" : "error");
    return false;
  }
}

function onVoiceRegistered(voice) {
  localVoices.push({ kind: "cloned", ...voice });
  loadVoices(voice.id).then(() => {
    el.voice.value = voice.id;
    savePrefs();
  });
}

// ---- the session -----------------------------------------------------------------------------

function currentConfig() {
  return {
    voice: el.voice.value || DEFAULT_VOICE,
    format: el.format.value,
    speed: Number(el.speed.value),
  };
}

/** Close the current session (voice, format or speed changed, or a new token). */
function retireSession() {
  if (!session) return;
  const old = session;
  session = null;
  current = null;
  discarding = false;
  player.clear();
  for (const u of utterances.values()) {
    if (u.status === "queued" || u.status === "playing") setUtteranceStatus(u, "interrupted");
  }
  old.abort();
}

/** The open session for the current settings, opening a new one if needed. */
async function ensureSession() {
  const config = currentConfig();
  if (session && session.isOpen && session.key === StreamSession.key(config)) return session;
  if (session) {
    log("info", "voice, format or speed changed: opening a new session");
    retireSession();
  }
  const s = new StreamSession(token, config);
  s.addEventListener("message", (e) => onMessage(s, e.detail));
  s.addEventListener("audio", (e) => onAudio(s, e.detail));
  s.addEventListener("sent", (e) => {
    const msg = e.detail;
    if (msg.type === "mark") log("out", msg.name, "mark");
    else log("out", describeMessage(msg), msg.type);
  });
  s.addEventListener("close", (e) => onClose(s, e.detail));
  setState("connecting");
  opening = s;
  try {
    const ready = await s.open();
    session = s;
    discarding = false;
    player.configure(ready.format, ready.sample_rate);
    demo.sessionsOpened++;
    hideError();
    return s;
  } finally {
    opening = null;
  }
}

/** An utterance ended: the next queued one reaches the head of the gateway's queue. */
function advanceQueue() {
  const next = [...utterances.values()].find((x) => x.status === "queued" && x.startAt === null);
  if (next) next.startAt = performance.now();
}

function onMessage(s, msg) {
  if (s !== session && s !== opening) return; // a retired session
  log("in", describeMessage(msg), msg.type);
  // While opening, the only messages are `ready` or an `error` that speak() reports.
  if (s !== session) return;
  switch (msg.type) {
    case "utterance_started": {
      demo.utterancesStarted++;
      current = utterances.get(msg.utterance_id) || null;
      if (current) setUtteranceStatus(current, "playing");
      break;
    }
    case "utterance_done": {
      demo.utterancesDone++;
      const u = utterances.get(msg.utterance_id);
      if (u) {
        u.audioMs = msg.audio_ms;
        u.serverFirstAudioMs = msg.first_audio_ms;
        demo.lastServerFirstAudioMs = msg.first_audio_ms;
        if (u.status === "playing") setUtteranceStatus(u, "done");
        else renderUtterance(u);
        showLatency(u);
      }
      if (current === u) current = null;
      advanceQueue();
      updateState();
      break;
    }
    case "mark":
      demo.marks++;
      break;
    case "cleared":
      demo.clearedAcks++;
      discarding = false;
      break;
    case "error": {
      const err = new GatewayError(msg.code, msg.message || msg.code, { fromGateway: true });
      if (msg.code === "unknown_voice") loadVoices();
      const u = msg.utterance_id ? utterances.get(msg.utterance_id) : null;
      if (u) {
        setUtteranceStatus(u, "failed");
        if (current === u) current = null;
        advanceQueue();
      }
      showError(err);
      break;
    }
    default:
      break;
  }
}

function onAudio(s, buffer) {
  if (s !== session) return;
  demo.packetsReceived++;
  if (discarding) {
    demo.framesDropped++; // sent before the gateway saw our `clear`
    return;
  }
  const u = current;
  if (u) {
    u.frames++;
    if (u.firstAudioMs === null) {
      u.firstAudioMs = Math.round(performance.now() - (u.startAt ?? u.sentAt));
      demo.lastFirstAudioMs = u.firstAudioMs;
      showLatency(u);
      renderUtterance(u);
    }
  }
  player.push(buffer);
}

function onClose(s, { code, error }) {
  log("info", `connection closed (${code})`, "close");
  // Retired sessions are gone already; one that failed while opening is reported by speak().
  if (s !== session) return;
  session = null;
  current = null;
  discarding = false;
  for (const u of utterances.values()) {
    if (u.status === "queued" || u.status === "playing") setUtteranceStatus(u, "interrupted");
  }
  if (error) {
    if (!s.lastError) showError(error); // else its `error` message was shown already
    setState("error");
  } else {
    updateState();
  }
}

function scheduleIdleClose() {
  clearTimeout(idleTimer);
  if (!session || demo.state !== "idle") return;
  idleTimer = setTimeout(() => {
    if (session && demo.state === "idle") {
      log("info", "closing the idle session");
      session.close();
    }
  }, IDLE_CLOSE_MS);
}

// ---- speak and clear -----------------------------------------------------------------------

async function speak() {
  const text = el.text.value.trim();
  if (!text) {
    showError(new GatewayError("empty_text", "nothing to speak"));
    el.text.focus();
    return;
  }
  if (!token) {
    showError(new GatewayError("token_missing", "no token"));
    return;
  }
  if (opening) return; // Speak pressed twice while connecting
  // Audio may only start from a user gesture: create/resume the context first.
  try {
    await player.start();
  } catch (err) {
    showError(new GatewayError("audio_unavailable", String(err)));
    return;
  }
  let s;
  try {
    s = await ensureSession();
  } catch (err) {
    if (err.code === "unknown_voice") loadVoices();
    showError(err);
    setState("error");
    return;
  }
  hideError();
  const id = `u${++utteranceSeq}`;
  const now = performance.now();
  const u = {
    id,
    text,
    voice: s.config.voice,
    language: selectedVoiceLanguage(),
    format: s.config.format,
    status: "queued",
    sentAt: now,
    startAt: null, // when it reached the head of the gateway's queue
    firstAudioMs: null,
    serverFirstAudioMs: null,
    audioMs: null,
    frames: 0,
  };
  // Behind an unfinished utterance it waits: its latency runs from when that one is done.
  const busy = [...utterances.values()].some((x) => x.status === "queued" || x.status === "playing");
  if (!busy) u.startAt = now;
  utterances.set(id, u);
  forgetOldUtterances();
  addUtterance(u);
  try {
    s.speak(text, id);
    s.mark(`after-${id}`); // echoed once its audio is sent (or dropped by a clear)
  } catch (err) {
    setUtteranceStatus(u, "failed");
    showError(err);
    return;
  }
  setState("speaking");
}

/** Keep the last HISTORY_LIMIT utterances (the history list shows as many). */
function forgetOldUtterances() {
  for (const [id, u] of utterances) {
    if (utterances.size <= HISTORY_LIMIT) break;
    if (u.status !== "queued" && u.status !== "playing") utterances.delete(id);
  }
}

/** Barge-in: silence now, tell the gateway to drop everything queued. */
function clearPlayback() {
  player.clear();
  demo.clears++;
  current = null;
  for (const u of utterances.values()) {
    if (u.status === "queued" || u.status === "playing") setUtteranceStatus(u, "cleared");
  }
  if (session && session.isOpen) {
    discarding = true; // until `cleared`: frames already on the wire are dropped
    session.clear();
  }
  if (demo.state === "speaking") setState("idle");
  updateState();
}

// ---- latency, history, meters ----------------------------------------------------------------

function showLatency(u) {
  if (u.firstAudioMs !== null) el.latency.textContent = `${u.firstAudioMs} ms`;
  el.latencyServer.textContent =
    u.serverFirstAudioMs !== null
      ? `gateway ${u.serverFirstAudioMs} ms · ${u.voice}`
      : `speak → first packet · ${u.voice}`;
  el.audioLength.textContent =
    u.audioMs !== null ? `${(u.audioMs / 1000).toFixed(2)} s of audio` : "queued for playback";
}

const STATUS_LABELS = {
  queued: "queued",
  playing: "playing",
  done: "done",
  cleared: "cleared",
  interrupted: "interrupted",
  failed: "failed",
};

function addUtterance(u) {
  const li = document.createElement("li");
  li.className = "utt";
  li.id = `utt-${u.id}`;
  const text = document.createElement("p");
  text.className = "utt-text";
  text.textContent = u.text;
  if (u.language) text.lang = u.language; // CJK text gets CJK fonts and line breaking
  const meta = document.createElement("div");
  meta.className = "utt-meta";
  li.append(text, meta);
  el.history.prepend(li);
  el.historyEmpty.hidden = true;
  while (el.history.childElementCount > HISTORY_LIMIT) el.history.lastElementChild.remove();
  renderUtterance(u);
}

function setUtteranceStatus(u, status) {
  u.status = status;
  renderUtterance(u);
}

function renderUtterance(u) {
  const li = document.getElementById(`utt-${u.id}`);
  if (!li) return;
  const meta = li.querySelector(".utt-meta");
  const chip = (label, value, cls = "") => {
    const span = document.createElement("span");
    span.className = `chip-stat ${cls}`;
    const b = document.createElement("b");
    b.textContent = value;
    span.append(`${label} `, b);
    return span;
  };
  const status = document.createElement("span");
  status.className = `badge badge-${u.status}`;
  status.textContent = STATUS_LABELS[u.status] || u.status;
  const parts = [status, chip("voice", u.voice)];
  if (u.firstAudioMs !== null) parts.push(chip("first audio", `${u.firstAudioMs} ms`));
  if (u.serverFirstAudioMs !== null) parts.push(chip("gateway", `${u.serverFirstAudioMs} ms`));
  if (u.audioMs !== null) parts.push(chip("length", `${(u.audioMs / 1000).toFixed(2)} s`));
  meta.replaceChildren(...parts);
}

/**
 * The waveform: a rolling history of the output's peak level, one column per 20 ms
 * (4.8 s across), drawn as mirrored bars.
 */
const WAVE_COLUMN_MS = 20;
const wave = {
  levels: new Float32Array(240),
  head: 0, // the oldest column
  lastColumn: 0, // time of the last column pushed
  quiet: Infinity, // consecutive silent columns: nothing to redraw once all are silent
  colors: { base: "#d5d9f6", bar: "#4f46e5" },
  lastStats: 0,
};

function readWaveColors() {
  const style = getComputedStyle(el.wave);
  wave.colors.base = style.getPropertyValue("--wave-base").trim() || wave.colors.base;
  wave.colors.bar = style.getPropertyValue("--wave-color").trim() || wave.colors.bar;
}

function resizeCanvas() {
  const ratio = window.devicePixelRatio || 1;
  const { width, height } = el.wave.getBoundingClientRect();
  el.wave.width = Math.max(1, Math.round(width * ratio));
  el.wave.height = Math.max(1, Math.round(height * ratio));
  readWaveColors();
  drawWave();
}

function pushLevel(now, level) {
  if (now - wave.lastColumn > WAVE_COLUMN_MS * wave.levels.length) wave.lastColumn = now; // was hidden
  let pushed = false;
  while (now - wave.lastColumn >= WAVE_COLUMN_MS) {
    wave.lastColumn += WAVE_COLUMN_MS;
    wave.levels[wave.head] = level;
    wave.head = (wave.head + 1) % wave.levels.length;
    wave.quiet = level > 0.001 ? 0 : wave.quiet + 1;
    pushed = true;
  }
  return pushed && wave.quiet <= wave.levels.length;
}

function drawWave() {
  const canvas = el.wave;
  const g = canvas.getContext("2d");
  const { width: w, height: h } = canvas;
  g.clearRect(0, 0, w, h);
  g.fillStyle = wave.colors.base;
  g.fillRect(0, Math.floor(h / 2), w, Math.max(1, Math.round(h / 120)));
  const n = wave.levels.length;
  const step = w / n;
  const barWidth = Math.max(1, step * 0.6);
  g.fillStyle = wave.colors.bar;
  for (let i = 0; i < n; i++) {
    const level = wave.levels[(wave.head + i) % n];
    if (level <= 0.001) continue;
    // sqrt: quiet speech is still visible; the gateway's audio peaks well below 1.
    const bar = Math.min(1, Math.sqrt(level)) * (h * 0.46);
    g.fillRect(i * step, h / 2 - bar, barWidth, bar * 2);
  }
}

function frame(now) {
  const level = player.level();
  if (level > demo.maxLevel) demo.maxLevel = level;
  if (pushLevel(now, level)) drawWave();
  const db = level > 0 ? 20 * Math.log10(level) : -Infinity;
  const pct = Math.max(0, Math.min(100, ((db + 60) / 60) * 100));
  el.meterFill.style.width = `${pct}%`;
  if (now - wave.lastStats > 100) {
    wave.lastStats = now;
    el.meter.setAttribute("aria-valuenow", String(Math.round(pct)));
    el.meter.setAttribute("aria-valuetext", Number.isFinite(db) ? `${db.toFixed(0)} dBFS` : "silence");
    el.buffered.textContent = `${player.queuedSeconds.toFixed(2)} s`;
    el.stats.received.textContent = demo.packetsReceived.toLocaleString();
    el.stats.decoded.textContent = player.packetsDecoded.toLocaleString();
    const ctxRate = player.ctx ? player.ctx.sampleRate : 48000;
    el.stats.scheduled.textContent = `${(player.samplesScheduled / ctxRate).toFixed(1)} s`;
    el.stats.path.textContent = pathLabel();
    if (demo.state === "speaking") updateState();
  }
  requestAnimationFrame(frame);
}

function pathLabel() {
  const format = session ? session.config.format : el.format.value;
  const codec = FORMATS[format] ? FORMATS[format].codec : "?";
  const decoder = { opus: "WebCodecs Opus", pcm: "PCM", mulaw: "G.711 μ-law" }[codec];
  const output = { worklet: "AudioWorklet", "buffer-source": "AudioBufferSource", none: "not started" }[
    player.outputKind
  ];
  return `${decoder} → ${output}`;
}

// ---- preferences, examples, keyboard ----------------------------------------------------------

function savedPrefs() {
  try {
    return JSON.parse(localStorage.getItem(PREFS_KEY) || "{}");
  } catch {
    return {};
  }
}

function savePrefs() {
  const prefs = { voice: el.voice.value, format: el.format.value, speed: el.speed.value };
  localStorage.setItem(PREFS_KEY, JSON.stringify(prefs));
}

function fillExamples() {
  for (const prompt of PROMPTS) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "example";
    button.lang = prompt.lang;
    button.textContent = prompt.label;
    button.title = prompt.text;
    button.dataset.lang = prompt.lang;
    button.addEventListener("click", () => {
      el.text.value = prompt.text;
      el.text.lang = prompt.lang;
      updateCharCount();
      // Keep the chosen voice when it speaks the prompt's language.
      const voice = prompt.voices.find((id) => demo.voices.includes(id));
      if (!voiceSpeaks(selectedVoiceLanguage(), prompt.lang) && voice) {
        el.voice.value = voice;
        savePrefs();
      }
      el.text.focus();
    });
    el.examples.append(button);
  }
}

function fillFormats(opus) {
  for (const [id, spec] of Object.entries(FORMATS)) {
    const option = new Option(spec.label, id);
    if (spec.codec === "opus" && !opus) {
      option.disabled = true;
      option.textContent += " — needs WebCodecs";
    }
    el.format.append(option);
  }
  const saved = savedPrefs().format;
  const usable = (id) => FORMATS[id] && (FORMATS[id].codec !== "opus" || opus);
  el.format.value = usable(saved) ? saved : opus ? "opus_48000" : "pcm_48000";
  el.formatNote.textContent = opus
    ? ""
    : "Opus needs WebCodecs (a secure page: https or localhost); playing PCM instead.";
}

function updateCharCount() {
  el.charCount.textContent = `${el.text.value.length} / ${el.text.maxLength}`;
}

function bindControls() {
  el.speak.addEventListener("click", () => speak());
  el.clear.addEventListener("click", () => clearPlayback());
  el.alertClose.addEventListener("click", () => hideError());
  el.logClear.addEventListener("click", () => el.log.replaceChildren());
  el.text.addEventListener("input", updateCharCount);
  el.speed.addEventListener("input", () => {
    el.speedValue.textContent = `${Number(el.speed.value).toFixed(2)}×`;
  });
  for (const control of [el.voice, el.format, el.speed]) {
    control.addEventListener("change", savePrefs);
  }
  el.tokenForm.addEventListener("submit", (e) => {
    e.preventDefault(); // nothing is submitted anywhere: the token stays in this tab
    useToken(el.tokenInput.value);
    el.tokenInput.value = "";
  });
  el.tokenForget.addEventListener("click", () => useToken(""));
  // Shortcuts: Ctrl/Cmd+Enter speaks, Esc clears (barge-in), from anywhere on the page.
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      speak();
    } else if (e.key === "Escape" && !e.defaultPrevented) {
      if (e.target instanceof HTMLSelectElement) return; // Esc closes an open picker
      clearPlayback();
    }
  });
  window.addEventListener("hashchange", () => {
    if (new URLSearchParams(location.hash.slice(1)).get("token")) useToken(readToken());
  });
  window.addEventListener("pagehide", () => {
    if (session) session.abort();
  });
  new ResizeObserver(resizeCanvas).observe(el.wave);
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", resizeCanvas);
}

// ---- start -------------------------------------------------------------------------------------

const voiceLab = new VoiceLab({
  getToken: () => token,
  onRegistered: onVoiceRegistered,
  log: (kind, text) => log(kind, text),
  counters: demo,
});

async function main() {
  fillExamples();
  fillVoices([]);
  el.text.value = PROMPTS[0].text;
  updateCharCount();
  const prefs = savedPrefs();
  if (prefs.speed) el.speed.value = prefs.speed;
  el.speedValue.textContent = `${Number(el.speed.value).toFixed(2)}×`;
  bindControls();
  demo.opus = await opusSupported();
  fillFormats(demo.opus);
  requestAnimationFrame(frame);
  log("info", `page ready · Opus decoding ${demo.opus ? "with WebCodecs" : "unavailable: PCM"}`);
  await useToken(readToken());
}

main();

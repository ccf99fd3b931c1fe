// "Clone a voice": record 3 to 10 s from the microphone (MediaRecorder) or pick a file,
// check its length, convert it to 16-bit mono WAV and register it with
// `POST /v1/voices` (multipart field `audio`, optional `name` and `language`, and
// `transcript`, what the sample says, which cloning backends use when they have it).
//
// The registry is newer than the streaming API: a gateway without it answers 404 or 405,
// and the panel says so instead of failing silently.

import { registerVoice } from "./gateway-client.js";
import { describeError } from "./errors.js";

export const MIN_SECONDS = 3;
export const MAX_SECONDS = 10;
const WAV_RATE = 24000; // 10 s of 16-bit mono at 24 kHz is 480 KB: well under upload limits

/** The first container MediaRecorder supports here (Chrome/Firefox: WebM/Ogg Opus; Safari: MP4). */
function recorderMimeType() {
  const candidates = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm", "audio/mp4"];
  if (typeof MediaRecorder === "undefined" || !MediaRecorder.isTypeSupported) return "";
  return candidates.find((t) => MediaRecorder.isTypeSupported(t)) || "";
}

/** Decode any audio the browser understands; null when it cannot. */
async function decodeAudio(blob) {
  try {
    const bytes = await blob.arrayBuffer();
    const ctx = new OfflineAudioContext(1, 1, WAV_RATE);
    return await ctx.decodeAudioData(bytes);
  } catch {
    return null;
  }
}

/** Mix down to mono and resample to WAV_RATE with an OfflineAudioContext, as 16-bit WAV. */
async function toWav(buffer) {
  const frames = Math.ceil(buffer.duration * WAV_RATE);
  const ctx = new OfflineAudioContext(1, frames, WAV_RATE);
  const source = ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(ctx.destination);
  source.start();
  const rendered = await ctx.startRendering();
  const pcm = rendered.getChannelData(0);
  // RIFF/WAVE header, PCM format 1 (Microsoft WAVE format, 44-byte canonical header).
  const out = new DataView(new ArrayBuffer(44 + pcm.length * 2));
  const ascii = (offset, s) => [...s].forEach((c, i) => out.setUint8(offset + i, c.charCodeAt(0)));
  ascii(0, "RIFF");
  out.setUint32(4, 36 + pcm.length * 2, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  out.setUint32(16, 16, true); // fmt chunk size
  out.setUint16(20, 1, true); // PCM
  out.setUint16(22, 1, true); // mono
  out.setUint32(24, WAV_RATE, true);
  out.setUint32(28, WAV_RATE * 2, true); // byte rate
  out.setUint16(32, 2, true); // block align
  out.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  out.setUint32(40, pcm.length * 2, true);
  for (let i = 0; i < pcm.length; i++) {
    const s = Math.max(-1, Math.min(1, pcm[i]));
    out.setInt16(44 + 2 * i, s < 0 ? s * 32768 : s * 32767, true);
  }
  return new Blob([out.buffer], { type: "audio/wav" });
}

function formatSeconds(s) {
  return `${s.toFixed(1)} s`;
}

export class VoiceLab {
  /**
   * @param {object} opts
   * @param {() => string} opts.getToken
   * @param {(voice: object) => void} opts.onRegistered  a voice was registered
   * @param {(kind: string, text: string) => void} opts.log  protocol log
   * @param {object} opts.counters  window.__demo: voicesRegistered, registry
   */
  constructor({ getToken, onRegistered, log, counters }) {
    this.getToken = getToken;
    this.onRegistered = onRegistered;
    this.log = log;
    this.counters = counters;
    this.el = {
      record: document.getElementById("record"),
      recordLabel: document.getElementById("record-label"),
      timer: document.getElementById("record-timer"),
      progress: document.getElementById("record-progress"),
      file: document.getElementById("voice-file"),
      preview: document.getElementById("voice-preview"),
      name: document.getElementById("voice-name"),
      transcript: document.getElementById("voice-transcript"),
      script: document.getElementById("voice-script"),
      language: document.getElementById("voice-language"),
      register: document.getElementById("register"),
      status: document.getElementById("voice-status"),
    };
    this.sample = null; // {blob, filename, seconds} ready to upload
    this.recorder = null; // the MediaRecorder while recording
    this.busy = false; // while an upload is in flight
    this.previewUrl = null;

    this.el.record.addEventListener("click", () =>
      this.recorder ? this.stopRecording() : this.startRecording(),
    );
    this.el.file.addEventListener("change", () => {
      const file = this.el.file.files && this.el.file.files[0];
      if (file) this.useSample(file, file.name);
    });
    this.el.register.addEventListener("click", () => this.register());
    this.el.name.addEventListener("input", () => this.updateButtons());
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia || !recorderMimeType()) {
      this.el.record.disabled = true;
      this.say(
        "info",
        "Recording needs a secure page (https or localhost) and MediaRecorder. Choose a file instead.",
      );
    }
    this.updateButtons();
  }

  /** Fill the language picker from the voices' languages. */
  setLanguages(languages, preferred) {
    const select = this.el.language;
    const current = select.value || preferred;
    select.replaceChildren();
    const names = new Intl.DisplayNames(["en"], { type: "language" });
    for (const lang of languages) {
      let label = lang;
      try {
        label = `${names.of(lang)} (${lang})`;
      } catch {
        // not a valid tag: show it as it is
      }
      select.append(new Option(label, lang, false, lang === current));
    }
  }

  say(kind, text) {
    this.el.status.dataset.kind = kind;
    this.el.status.textContent = text;
  }

  updateButtons() {
    const ok = this.sample !== null && !this.recorder && !this.busy;
    this.el.register.disabled = !ok;
  }

  async startRecording() {
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
      });
    } catch (err) {
      const denied = err && (err.name === "NotAllowedError" || err.name === "SecurityError");
      this.say(
        "error",
        denied
          ? "The browser did not allow the microphone. Allow it for this page, or choose a file."
          : "No microphone could be opened. Choose a file instead.",
      );
      return;
    }
    const mimeType = recorderMimeType();
    const recorder = new MediaRecorder(stream, mimeType ? { mimeType } : undefined);
    const chunks = [];
    recorder.ondataavailable = (e) => {
      if (e.data && e.data.size > 0) chunks.push(e.data);
    };
    recorder.onstop = () => {
      stream.getTracks().forEach((t) => t.stop());
      clearInterval(this.tick);
      const seconds = (performance.now() - this.startedAt) / 1000;
      this.recorder = null;
      this.el.record.classList.remove("recording");
      this.el.record.setAttribute("aria-pressed", "false");
      this.el.recordLabel.textContent = "Record again";
      const blob = new Blob(chunks, { type: recorder.mimeType || mimeType || "audio/webm" });
      const ext = blob.type.includes("mp4") ? "m4a" : blob.type.includes("ogg") ? "ogg" : "webm";
      // A recording of the suggested sentence: that is its transcript, unless edited.
      if (!this.el.transcript.value) this.el.transcript.value = this.el.script.textContent;
      this.useSample(blob, `recording.${ext}`, seconds);
    };
    this.recorder = recorder;
    this.startedAt = performance.now();
    recorder.start(250);
    this.el.record.classList.add("recording");
    this.el.record.setAttribute("aria-pressed", "true");
    this.el.recordLabel.textContent = "Stop";
    this.say("info", `Recording… speak naturally for ${MIN_SECONDS} to ${MAX_SECONDS} seconds.`);
    this.updateButtons();
    this.tick = setInterval(() => {
      const s = (performance.now() - this.startedAt) / 1000;
      this.el.timer.textContent = `${formatSeconds(Math.min(s, MAX_SECONDS))} / ${MAX_SECONDS} s`;
      this.el.progress.value = Math.min(s / MAX_SECONDS, 1);
      if (s >= MAX_SECONDS) this.stopRecording(); // a sample is at most 10 s
    }, 100);
  }

  stopRecording() {
    if (this.recorder && this.recorder.state !== "inactive") this.recorder.stop();
  }

  /** Check a recording or a file, keep it as WAV, and show a preview. */
  async useSample(blob, filename, recordedSeconds = null) {
    this.sample = null;
    this.updateButtons();
    if (this.previewUrl) URL.revokeObjectURL(this.previewUrl);
    this.previewUrl = URL.createObjectURL(blob);
    this.el.preview.src = this.previewUrl;
    this.el.preview.hidden = false;

    const decoded = await decodeAudio(blob);
    if (!decoded) {
      // The browser cannot read it; the gateway may: send it as it is.
      this.sample = { blob, filename, seconds: recordedSeconds };
      this.say("info", `“${filename}” is ready. This browser cannot check its length; the gateway will.`);
      this.updateButtons();
      return;
    }
    const seconds = decoded.duration;
    this.el.timer.textContent = `${formatSeconds(seconds)}`;
    this.el.progress.value = Math.min(seconds / MAX_SECONDS, 1);
    if (seconds < MIN_SECONDS - 0.05) {
      this.say("error", `That sample is ${formatSeconds(seconds)} long: record at least ${MIN_SECONDS} seconds.`);
      this.updateButtons();
      return;
    }
    if (seconds > MAX_SECONDS + 0.25) {
      this.say("error", `That sample is ${formatSeconds(seconds)} long: at most ${MAX_SECONDS} seconds, please.`);
      this.updateButtons();
      return;
    }
    const wav = await toWav(decoded);
    this.sample = { blob: wav, filename: filename.replace(/\.[^.]*$/, "") + ".wav", seconds };
    this.say("info", `Sample ready: ${formatSeconds(seconds)}. Give it a name and register it.`);
    this.updateButtons();
  }

  async register() {
    if (!this.sample) return;
    const token = this.getToken();
    if (!token) {
      this.say("error", "Sign in first: open the link that `make run` printed.");
      return;
    }
    this.busy = true;
    this.updateButtons();
    const name = this.el.name.value.trim() || "My voice";
    const language = this.el.language.value;
    const transcript = this.el.transcript.value.trim();
    this.say("info", "Registering the voice…");
    this.log("out", `POST /v1/voices name=“${name}” language=${language} (${this.sample.blob.size} bytes)`);
    try {
      const voice = await registerVoice(token, {
        audio: this.sample.blob,
        filename: this.sample.filename,
        name,
        language,
        transcript,
      });
      this.counters.registry = "available";
      this.counters.voicesRegistered++;
      this.log("in", `201 voice ${voice.id} “${voice.name}” (${voice.duration_ms} ms)`);
      this.say("ok", `Voice “${voice.name}” is registered and selected in the voice picker.`);
      this.sample = null; // registered: a second click must not register it twice
      this.el.file.value = "";
      this.onRegistered(voice);
    } catch (err) {
      if (err.status === 404 || err.status === 405) {
        this.counters.registry = "unavailable";
        this.log("error", `POST /v1/voices: ${err.status}`);
        this.say(
          "warn",
          `This gateway has no voice registry yet (POST /v1/voices answered ${err.status}). ` +
            "The built-in voices still work.",
        );
      } else {
        const { title, text, code } = describeError(err);
        this.log("error", `POST /v1/voices: ${err.status || ""} ${code}`);
        const hint =
          err.status === 413
            ? "The file is too large: keep it under 10 seconds."
            : err.status === 400 || err.status === 415 || err.status === 422
              ? `The gateway did not accept the sample: ${err.message}.`
              : `${title}. ${text}`;
        this.say("error", hint);
      }
    } finally {
      this.busy = false;
      this.updateButtons();
    }
  }
}

// Streaming playback for the demo page: decode each binary frame from the gateway and
// queue it for playback as soon as it arrives.
//
//   binary frame --decoder--> Float32 PCM --resampler--> output --> analyser --> speakers
//
// Decoders: Opus with WebCodecs' AudioDecoder (one 20 ms packet per frame, W3C WebCodecs
// and its Opus registration, https://www.w3.org/TR/webcodecs-opus-codec-registration/),
// 16-bit little-endian PCM, and G.711 mu-law (ITU-T G.711).
// Outputs: an AudioWorkletNode running playback-worklet.js (a queue on the audio thread
// that Clear flushes at once), or, where AudioWorklet is missing (it needs a secure
// context: https or localhost), AudioBufferSourceNodes scheduled back to back.

/** The formats the page can play, by the gateway's format name. */
export const FORMATS = {
  opus_48000: { label: "Opus, 48 kHz", codec: "opus", sampleRate: 48000 },
  pcm_48000: { label: "PCM 16-bit, 48 kHz", codec: "pcm", sampleRate: 48000 },
  pcm_16000: { label: "PCM 16-bit, 16 kHz", codec: "pcm", sampleRate: 16000 },
  mulaw_8000: { label: "G.711 μ-law, 8 kHz (phone line)", codec: "mulaw", sampleRate: 8000 },
};

/** Whether this browser decodes Opus with WebCodecs (false in insecure contexts). */
export async function opusSupported() {
  if (typeof AudioDecoder === "undefined" || typeof EncodedAudioChunk === "undefined") {
    return false;
  }
  try {
    const { supported } = await AudioDecoder.isConfigSupported(OPUS_CONFIG);
    return supported === true;
  } catch {
    return false;
  }
}

const OPUS_CONFIG = { codec: "opus", sampleRate: 48000, numberOfChannels: 1 };
const FRAME_US = 20_000; // every frame the gateway sends is 20 ms

// --- decoders: ArrayBuffer in, (Float32Array, sampleRate) out through `onSamples` ----------

/** Opus packets through WebCodecs. Asynchronous: output arrives a moment later. */
class OpusDecoder {
  constructor(onSamples, onError) {
    this.onSamples = onSamples;
    this.onError = onError;
    this.timestamp = 0; // microseconds, one packet every 20 ms
    this.dropBefore = 0; // outputs older than this were cleared
    this.decoder = null;
    this.open();
  }

  open() {
    this.decoder = new AudioDecoder({
      output: (data) => this.output(data),
      error: (err) => {
        this.decoder = null; // a failed decoder is closed: the next packet reopens one
        this.onError(err);
      },
    });
    // Raw Opus packets need no description (no Ogg/ID header): the registration says
    // a missing description means the default channel mapping.
    this.decoder.configure(OPUS_CONFIG);
  }

  decode(buffer) {
    if (!this.decoder) this.open();
    const chunk = new EncodedAudioChunk({ type: "key", timestamp: this.timestamp, data: buffer });
    this.timestamp += FRAME_US;
    this.decoder.decode(chunk);
  }

  output(data) {
    try {
      if (data.timestamp < this.dropBefore) return; // decoded before a Clear
      const samples = new Float32Array(data.numberOfFrames);
      // Channel 0 as planar float: every browser converts to f32-planar.
      data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
      this.onSamples(samples, data.sampleRate);
    } finally {
      data.close();
    }
  }

  /** Drop what is being decoded: reset() aborts pending work, then configure again. */
  reset() {
    this.dropBefore = this.timestamp;
    if (this.decoder && this.decoder.state === "configured") {
      this.decoder.reset();
      this.decoder.configure(OPUS_CONFIG);
    }
  }

  close() {
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    this.decoder = null;
  }
}

/** 16-bit little-endian mono PCM. */
class PcmDecoder {
  constructor(sampleRate, onSamples) {
    this.sampleRate = sampleRate;
    this.onSamples = onSamples;
  }

  decode(buffer) {
    const view = new DataView(buffer);
    const n = buffer.byteLength >> 1;
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    this.onSamples(out, this.sampleRate);
  }

  reset() {}
  close() {}
}

/** G.711 mu-law, expanded with the standard table (ITU-T G.711, table 2a). */
const MULAW_TABLE = (() => {
  const table = new Float32Array(256);
  for (let i = 0; i < 256; i++) {
    const u = ~i & 0xff;
    let t = ((u & 0x0f) << 3) + 0x84;
    t <<= (u & 0x70) >> 4;
    table[i] = ((u & 0x80) ? 0x84 - t : t - 0x84) / 32768;
  }
  return table;
})();

class MulawDecoder {
  constructor(sampleRate, onSamples) {
    this.sampleRate = sampleRate;
    this.onSamples = onSamples;
  }

  decode(buffer) {
    const bytes = new Uint8Array(buffer);
    const out = new Float32Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) out[i] = MULAW_TABLE[bytes[i]];
    this.onSamples(out, this.sampleRate);
  }

  reset() {}
  close() {}
}

// --- resampling to the AudioContext's rate ----------------------------------------------------

/**
 * Linear-interpolation resampler that keeps its phase across chunks, so 20 ms frames
 * join without clicks. Good enough to listen to 8 and 16 kHz telephony audio.
 */
class LinearResampler {
  constructor(fromRate, toRate) {
    this.step = fromRate / toRate; // input samples per output sample
    this.reset();
  }

  reset() {
    this.t = 0; // position of the next output sample, in input samples of the next chunk
    this.prev = 0; // the previous chunk's last sample (position -1)
  }

  process(input) {
    if (this.step === 1) return input;
    const n = input.length;
    const out = new Float32Array(Math.max(0, Math.ceil((n - this.t) / this.step)));
    let k = 0;
    let t = this.t;
    while (t <= n - 1 && k < out.length) {
      const i = Math.floor(t);
      const f = t - i;
      const a = i < 0 ? this.prev : input[i];
      const b = i + 1 < n ? input[i + 1] : a;
      out[k++] = a + (b - a) * f;
      t += this.step;
    }
    this.t = t - n;
    if (n > 0) this.prev = input[n - 1];
    return k === out.length ? out : out.subarray(0, k);
  }
}

// --- outputs ------------------------------------------------------------------------------

/** The AudioWorklet queue (playback-worklet.js). */
class WorkletOutput {
  static async create(ctx, destination, onDrained) {
    await ctx.audioWorklet.addModule(new URL("./playback-worklet.js", import.meta.url));
    const node = new AudioWorkletNode(ctx, "playback-queue", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
    });
    node.connect(destination);
    return new WorkletOutput(ctx, node, onDrained);
  }

  constructor(ctx, node, onDrained) {
    this.kind = "worklet";
    this.ctx = ctx;
    this.node = node;
    this.queued = 0; // samples, as last reported by the worklet plus what was pushed since
    this.played = 0;
    node.port.onmessage = ({ data }) => {
      if (data.type === "status") {
        this.queued = data.queued;
        this.played = data.played;
      } else if (data.type === "drained") {
        this.queued = 0;
        this.played = data.played;
        onDrained();
      }
    };
  }

  push(samples) {
    this.queued += samples.length;
    this.node.port.postMessage({ type: "push", samples }, [samples.buffer]);
  }

  clear() {
    this.queued = 0;
    this.node.port.postMessage({ type: "clear" });
  }

  get queuedSeconds() {
    return this.queued / this.ctx.sampleRate;
  }
}

/** Fallback without AudioWorklet: one AudioBufferSourceNode per chunk, back to back. */
class BufferOutput {
  constructor(ctx, destination, onDrained) {
    this.kind = "buffer-source";
    this.ctx = ctx;
    this.destination = destination;
    this.onDrained = onDrained;
    this.sources = new Set();
    this.nextTime = 0;
    this.scheduled = 0; // samples handed to sources, less those a clear dropped
  }

  push(samples) {
    const buffer = this.ctx.createBuffer(1, samples.length, this.ctx.sampleRate);
    buffer.copyToChannel(samples, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.destination);
    // Start right away after a gap (with 10 ms of margin), else right after the last chunk.
    this.nextTime = Math.max(this.nextTime, this.ctx.currentTime + 0.01);
    source.start(this.nextTime);
    this.nextTime += buffer.duration;
    this.scheduled += samples.length;
    this.sources.add(source);
    source.onended = () => {
      this.sources.delete(source);
      if (this.sources.size === 0) this.onDrained();
    };
  }

  clear() {
    this.scheduled -= Math.round(this.queuedSeconds * this.ctx.sampleRate);
    for (const source of this.sources) {
      source.onended = null;
      source.stop();
    }
    this.sources.clear();
    this.nextTime = 0;
  }

  get queuedSeconds() {
    return Math.max(0, this.nextTime - this.ctx.currentTime);
  }

  get played() {
    return Math.round(this.scheduled - this.queuedSeconds * this.ctx.sampleRate);
  }
}

// --- the player -----------------------------------------------------------------------------

/**
 * One AudioContext for the page's lifetime; a decoder per session format.
 *
 * Counters (read by the page and by the tests through window.__demo):
 * packetsDecoded, samplesScheduled (at the context's rate), decodeErrors.
 */
export class AudioPlayer {
  constructor({ onDrained = () => {}, onError = () => {} } = {}) {
    this.onDrained = onDrained;
    this.onError = onError;
    this.ctx = null;
    this.output = null;
    this.analyser = null;
    this.decoder = null;
    this.resampler = null;
    this.format = null;
    this.packetsDecoded = 0;
    this.samplesScheduled = 0;
    this.decodeErrors = 0;
    this.starting = null;
  }

  /**
   * Create (or resume) the AudioContext. Call it from a click or key handler: browsers
   * only let a page start audio after a user gesture.
   */
  start() {
    if (!this.ctx) {
      this.ctx = new AudioContext({ sampleRate: 48000, latencyHint: "interactive" });
      this.analyser = this.ctx.createAnalyser();
      this.analyser.fftSize = 2048;
      this.analyser.connect(this.ctx.destination);
      this.starting = this.createOutput();
    }
    if (this.ctx.state === "suspended") this.ctx.resume();
    return this.starting;
  }

  async createOutput() {
    const drained = () => this.onDrained();
    if (this.ctx.audioWorklet && typeof AudioWorkletNode !== "undefined") {
      try {
        this.output = await WorkletOutput.create(this.ctx, this.analyser, drained);
        return;
      } catch (err) {
        console.warn("AudioWorklet unavailable, using AudioBufferSourceNodes:", err);
      }
    }
    this.output = new BufferOutput(this.ctx, this.analyser, drained);
  }

  get outputKind() {
    return this.output ? this.output.kind : "none";
  }

  get contextState() {
    return this.ctx ? this.ctx.state : "none";
  }

  /** Set up the decoder for a session's format (the `ready` message's format and rate). */
  configure(format, sampleRate) {
    const spec = FORMATS[format];
    if (!spec) throw new Error(`the page cannot play ${format}`);
    if (this.format === format && this.decoder) return;
    if (this.decoder) this.decoder.close();
    const onSamples = (samples, rate) => this.schedule(samples, rate);
    if (spec.codec === "opus") {
      this.decoder = new OpusDecoder(onSamples, (err) => {
        this.decodeErrors++;
        this.onError(err);
      });
    } else if (spec.codec === "pcm") {
      this.decoder = new PcmDecoder(sampleRate, onSamples);
    } else {
      this.decoder = new MulawDecoder(sampleRate, onSamples);
    }
    this.format = format;
    this.resampler = null;
  }

  /** Decode one binary frame from the gateway and queue it. */
  push(buffer) {
    if (!this.decoder) return;
    try {
      this.decoder.decode(buffer);
    } catch (err) {
      this.decodeErrors++;
      this.onError(err);
    }
  }

  schedule(samples, rate) {
    this.packetsDecoded++;
    if (!this.output) return;
    if (!this.resampler || this.resampler.fromRate !== rate) {
      this.resampler = new LinearResampler(rate, this.ctx.sampleRate);
      this.resampler.fromRate = rate;
    }
    const out = this.resampler.process(samples);
    if (out.length === 0) return;
    this.samplesScheduled += out.length;
    this.output.push(out);
  }

  /** Barge-in: stop what is playing and drop everything queued or being decoded. */
  clear() {
    if (this.decoder) this.decoder.reset();
    if (this.resampler) this.resampler.reset();
    if (this.output) this.output.clear();
  }

  /** Samples the output has played (the worklet reports it; the fallback estimates it). */
  get samplesPlayed() {
    return this.output ? this.output.played : 0;
  }

  /** Seconds of audio waiting to be played. */
  get queuedSeconds() {
    return this.output ? this.output.queuedSeconds : 0;
  }

  /** Peak level (0..1) of what is playing now, from the analyser. */
  level() {
    if (!this.analyser) return 0;
    const data = this.levelBuffer || (this.levelBuffer = new Float32Array(this.analyser.fftSize));
    this.analyser.getFloatTimeDomainData(data);
    let peak = 0;
    for (let i = 0; i < data.length; i++) {
      const a = Math.abs(data[i]);
      if (a > peak) peak = a;
    }
    return peak;
  }
}

// AudioWorklet processor: the playback queue of the demo page.
//
// Runs on the audio rendering thread (Web Audio API, "AudioWorkletProcessor",
// https://webaudio.github.io/web-audio-api/#AudioWorkletProcessor). The main thread
// posts mono Float32 chunks at the context's sample rate; process() copies them to
// the output 128 frames at a time and outputs silence when the queue is empty.
//
// Messages in (port.postMessage):
//   {type: "push", samples: Float32Array}   append (the buffer may be transferred)
//   {type: "clear"}                         drop everything queued, at once (barge-in)
// Messages out:
//   {type: "status", queued, played, peak, playing}   about every 50 ms while there is
//                                              audio, and once more when it stops
//   {type: "drained", played}                 the queue ran empty after playing audio

const STATUS_EVERY_FRAMES = 2400; // 50 ms at 48 kHz

class PlaybackQueueProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    /** @type {Float32Array[]} */
    this.chunks = [];
    this.readIndex = 0; // position inside chunks[0]
    this.queued = 0; // samples waiting to be played
    this.played = 0; // samples played since the node was created
    this.playing = false;
    this.peak = 0; // peak of the output since the last status message
    this.sinceStatus = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    if (msg.type === "push") {
      if (msg.samples.length > 0) {
        this.chunks.push(msg.samples);
        this.queued += msg.samples.length;
      }
    } else if (msg.type === "clear") {
      this.chunks = [];
      this.readIndex = 0;
      this.queued = 0;
      this.stop();
    }
  }

  /** The queue is empty: tell the page once, so it can show "idle". */
  stop() {
    if (this.playing) {
      this.playing = false;
      this.port.postMessage({ type: "drained", played: this.played });
      this.postStatus();
    }
  }

  postStatus() {
    this.port.postMessage({
      type: "status",
      queued: this.queued,
      played: this.played,
      peak: this.peak,
      playing: this.playing,
    });
    this.peak = 0;
    this.sinceStatus = 0;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0]; // mono: the node has one output with one channel
    if (!out) return true;
    let written = 0;
    while (written < out.length && this.chunks.length > 0) {
      const chunk = this.chunks[0];
      const n = Math.min(out.length - written, chunk.length - this.readIndex);
      out.set(chunk.subarray(this.readIndex, this.readIndex + n), written);
      written += n;
      this.readIndex += n;
      if (this.readIndex >= chunk.length) {
        this.chunks.shift();
        this.readIndex = 0;
      }
    }
    out.fill(0, written); // underrun or idle: silence
    for (let i = 0; i < written; i++) {
      const a = Math.abs(out[i]);
      if (a > this.peak) this.peak = a;
    }
    if (written > 0) {
      this.playing = true;
      this.queued -= written;
      this.played += written;
      this.sinceStatus += out.length;
      if (this.sinceStatus >= STATUS_EVERY_FRAMES) this.postStatus();
    }
    if (this.queued === 0) this.stop();
    return true; // keep the node alive: it is reused for every utterance
  }
}

registerProcessor("playback-queue", PlaybackQueueProcessor);

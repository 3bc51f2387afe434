// Live updates: a server-sent event stream read with fetch (so that the
// bearer token goes in a header, which EventSource cannot send), parsed into
// (kind, data) for the caller, with the header's live/offline badge. It
// reconnects a second after the stream ends or fails, and waits for a token
// when the server asks for one.

import { $ } from "./dom.js";
import { askToken, authHeaders, token } from "./api.js";

export function setLive(on) {
  const l = $("#live");
  l.textContent = on ? "live" : "offline";
  l.className = "live " + (on ? "on" : "off");
  document.body.dataset.live = on ? "1" : "0";
}

export async function streamEvents(url, onEvent) {
  for (;;) {
    try {
      const r = await fetch(url, { headers: authHeaders({ Accept: "text/event-stream" }) });
      if (r.status === 401) {
        // Dismissed: wait for a token (the header's "token" button) rather
        // than asking again and again.
        const before = token();
        if (!(await askToken())) while (token() === before) await new Promise((res) => setTimeout(res, 1000));
        continue;
      }
      if (!r.ok || !r.body) throw new Error("stream: HTTP " + r.status);
      setLive(true);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let kind = "message", data = "";
          for (const line of chunk.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (chunk.startsWith(":")) continue; // keep-alive comment
          let parsed = {};
          try { parsed = data ? JSON.parse(data) : {}; } catch (_) { parsed = {}; }
          onEvent(kind, parsed);
        }
      }
    } catch (e) {
      console.warn("event stream", e);
    }
    setLive(false);
    await new Promise((res) => setTimeout(res, 1000));
  }
}

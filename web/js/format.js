// How the page writes figures, sizes, times and ids, in one place so that
// every view shows them alike ("–" for a figure that is missing).

export function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

export function bytes(b) {
  if (b === undefined || b === null) return "?";
  if (b >= 2 ** 30) return (b / 2 ** 30).toFixed(1) + " GiB";
  return Math.round(b / 2 ** 20) + " MiB";
}

export function fmt(x, digits = 4) { return x === null || x === undefined || !isFinite(x) ? "–" : Number(x).toFixed(digits); }

export function clock(iso) { return new Date(iso).toLocaleTimeString([], { hour12: false }); }

export function short(id) { return id ? id.slice(-8) : ""; }

export function duration(seconds) {
  if (seconds === null || !isFinite(seconds)) return "–";
  if (seconds < 10) return seconds.toFixed(1) + " s";
  const s = Math.round(seconds);
  if (s < 60) return s + " s";
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

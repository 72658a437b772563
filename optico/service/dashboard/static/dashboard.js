// The dashboard's behaviour: draw the charts the server computed, copy the best flags, and follow a
// running job live. Untrusted text (names, rationales, diagnoses, LLM output) is only ever inserted
// with textContent, never as HTML.
"use strict";

function readJson(id) {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}

function drawCharts() {
  if (typeof Plotly === "undefined") return;
  document.querySelectorAll("[data-figure]").forEach((el) => {
    const fig = readJson(el.dataset.figure);
    if (fig) Plotly.newPlot(el, fig.data, fig.layout, { displaylogo: false, responsive: true });
  });
}

function setupCopy() {
  document.querySelectorAll("button.copy").forEach((button) => {
    button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.copy).textContent;
      try {
        await navigator.clipboard.writeText(text);
      } catch (_) {  // no clipboard permission (http, headless): select the text instead
        const range = document.createRange();
        range.selectNodeContents(document.getElementById(button.dataset.copy));
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        document.execCommand("copy");
      }
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = "Copy flags"; }, 1500);
    });
  });
}

function pct(x) { return x === null || x === undefined ? "" : (100 * x).toFixed(1) + "%"; }

// Control, escape, bidi and invisible characters shown as escapes, as the server's pages show them
// (optico.textsafe): textContent keeps them, and a U+202E reorders the text after it.
const UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]|\udb40[\udc00-\udc7f]/g;

function escaped(c) {
  const code = c.codePointAt(0);
  const hex = (width) => code.toString(16).padStart(width, "0");
  return code < 0x100 ? "\\x" + hex(2) : code < 0x10000 ? "\\u" + hex(4) : "\\U" + hex(8);
}

// A bare CR as a line break, as the server writes it (a CR alone would read as nothing).
function visible(text) {
  return String(text).replace(/\r\n|\r/g, "\n").replace(UNSAFE, escaped);
}

function cell(tag, text, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = visible(text);
  return node;
}

// One table row, the same as the server renders in job.html.
function trialRow(jobId, r) {
  const tr = document.createElement("tr");
  tr.className = "trial fresh status-" + r.status;
  tr.dataset.index = r.index;
  const link = cell("a", String(r.index));
  link.href = "/jobs/" + jobId + "/trials/" + r.index;
  const first = cell("td"); first.appendChild(link); tr.appendChild(first);
  const conf = cell("td"); conf.appendChild(cell("code", r.strategy)); tr.appendChild(conf);
  const diff = cell("td", null, "diff");
  r.changes.forEach((c) => diff.appendChild(cell("code", c)));
  tr.appendChild(diff);
  tr.appendChild(cell("td", r.rationale, "why"));
  const mfu = cell("td", null, "num");
  if (r.mfu !== null) mfu.textContent = pct(r.mfu); else mfu.appendChild(cell("span", r.status, "fail"));
  tr.appendChild(mfu);
  const detail = cell("td", null, "detail");
  if (r.diagnosis) {
    detail.appendChild(cell("span", r.diagnosis, "diagnosis"));  // with its confidence (Failure.described)
  } else if (r.mem_max_gib) {
    detail.textContent = r.mem_max_gib.toFixed(1) + " / " + r.mem_limit_gib.toFixed(1) + " GiB";
  }
  tr.appendChild(detail);
  return tr;
}

// Shown literally: Plotly renders a subset of HTML in hover text, and a diagnosis is not ours
// (charts.plotly_text on the server).
function plotlyText(text) {
  const shown = visible(String(text).replace(/\r\n|\r|\n/g, "\\n"));  // one line, escapes visible
  return shown.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function hover(r) {
  return "#" + r.index + " " + plotlyText(r.strategy) + "<br>" + plotlyText((r.diagnosis || r.rationale || "").slice(0, 160));
}

function traceOf(r, names) {
  if (r.mfu === null) return names.indexOf("failed");
  return names.indexOf(r.above_baseline === false ? "below baseline" : "above baseline");
}

function showBest(jobId, best) {
  const summary = document.getElementById("best-summary");
  summary.textContent = "Trial ";
  const link = cell("a", String(best.trial));
  link.href = "/jobs/" + jobId + "/trials/" + best.trial;
  summary.appendChild(link);
  summary.appendChild(document.createTextNode(": MFU "));
  summary.appendChild(cell("strong", pct(best.mfu)));
  if (best.improvement !== null) {
    const gain = (100 * best.improvement).toFixed(1);
    summary.appendChild(document.createTextNode(" (" + (best.improvement >= 0 ? "+" : "") + gain + "% over the baseline)"));
  }
  document.getElementById("best-flags").textContent = best.megatron_args.join(" ");
  document.getElementById("best-box").hidden = false;
}

function sessionEnded() {
  if (document.getElementById("session-ended")) return;
  const note = cell("p", "Your session ended (its token was revoked, or you logged out): this page no longer follows the job. ");
  note.id = "session-ended";
  note.className = "error";
  const link = cell("a", "Log in again");
  link.href = "/login?next=" + encodeURIComponent(location.pathname);
  note.appendChild(link);
  document.querySelector("main").prepend(note);
}

// Follows a running job: each event that can change the trials fetches only the rows after the last
// one shown, appends them to the table and extends the charts' traces (a 1,000-trial job stays fast).
function followJob() {
  const live = readJson("live-data");
  if (!live || live.final || typeof EventSource === "undefined") return;
  let lastIndex = live.last_index;
  let busy = false, again = false;
  const mfuChart = document.getElementById("chart-mfu");
  const memChart = document.getElementById("chart-memory");
  const body = document.querySelector("#trials-table tbody");

  // What the chart's earlier points depend on, as the server now has it: failures sit just below the
  // lowest MFU measured so far (a lower one may have come), and the baseline's line appears once its
  // trial has run (the page may have opened before).
  function followChart(update) {
    const failed = live.mfu_traces.indexOf("failed");
    if (update.failure_y !== live.failure_y) {
      live.failure_y = update.failure_y;
      const shown = mfuChart.data[failed].y.length;
      if (shown) Plotly.restyle(mfuChart, { y: [new Array(shown).fill(live.failure_y)] }, [failed]);
    }
    if (live.baseline_mfu === null && update.baseline_mfu !== null) {
      live.baseline_mfu = update.baseline_mfu;
      Plotly.relayout(mfuChart, update.baseline_marks);
    }
  }

  let signedOut = false;
  let source = null;  // the open EventSource (connect() below)
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const response = await fetch("/ui/jobs/" + live.job_id + "/rows?after=" + lastIndex,
                                   { credentials: "same-origin", cache: "no-store" });
      // A session that ended (token revoked, logged out elsewhere) is redirected to the login page,
      // which fetch follows to a 200 of HTML: say so, and stop following, instead of failing to parse it.
      if (response.redirected || !(response.headers.get("content-type") || "").startsWith("application/json")) {
        if (response.ok || response.redirected) {
          signedOut = true;
          if (source) source.close();  // logged out elsewhere: the token still stands, so the stream would go on
          sessionEnded();
        }
        return;
      }
      if (!response.ok) return;
      const update = await response.json();
      followChart(update);
      update.rows.forEach((r) => {
        if (r.index <= lastIndex) return;
        body.appendChild(trialRow(live.job_id, r));
        const t = traceOf(r, live.mfu_traces);
        Plotly.extendTraces(mfuChart, { x: [[r.index], [r.index]], y: [[r.mfu === null ? live.failure_y : 100 * r.mfu],
          [r.best_so_far === null ? null : 100 * r.best_so_far]], text: [[hover(r)], ["best so far"]] },
          [t, live.mfu_traces.indexOf("best so far")]);
        const predicted = r.predicted_mem_gib === null ? null : Math.min(r.predicted_mem_gib, live.prediction_cap * live.limit_gib);
        Plotly.extendTraces(memChart, { x: [[r.index], [r.index]], y: [[r.mem_max_gib], [predicted]],
          text: [[""], [r.predicted_mem_gib === null ? "" : "predicted " + r.predicted_mem_gib.toFixed(1) + " GiB"]] }, [0, 1]);
        lastIndex = r.index;
      });
      document.getElementById("trial-count").textContent = String(document.querySelectorAll("#trials-table tbody tr").length);
      if (update.best) showBest(live.job_id, update.best);
      if (update.stop_reason) {
        document.getElementById("stop-reason").textContent = visible(update.stop_reason);
        document.getElementById("stop-box").hidden = false;
      }
      const status = document.getElementById("job-status");
      status.textContent = update.status;
      status.className = "badge " + update.status.split(" ")[0];
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }

  // EventSource reconnects by itself only after a dropped connection; a refused one (503: every stream
  // slot taken; a proxy's 502 while the server restarts) closes it for good. Reopen from the last event
  // seen, so the page never stops following a job that still runs.
  let lastEvent = live.last_event;
  function connect() {
    source = new EventSource("/ui/jobs/" + live.job_id + "/events?after=" + lastEvent);
    const seen = (e) => { if (e.lastEventId) lastEvent = e.lastEventId; };
    ["trial_done", "trial_lost", "state", "job_done"].forEach((kind) => source.addEventListener(kind, (e) => {
      seen(e); refresh();
    }));
    source.addEventListener("end", () => { source.close(); refresh(); });
    // The token was revoked: a reconnect would be redirected to the login page.
    source.addEventListener("session_ended", () => { signedOut = true; source.close(); sessionEnded(); });
    source.addEventListener("error", () => {
      if (source.readyState !== EventSource.CLOSED) return;
      // Refused: first ask for the rows (which finds a session that ended), then reconnect unless it had.
      setTimeout(async () => { await refresh(); if (!signedOut) connect(); }, RECONNECT_MS);
    });
  }
  connect();
}

const RECONNECT_MS = 5000;  // the server's Retry-After on a refused stream

document.addEventListener("DOMContentLoaded", () => {
  drawCharts();
  setupCopy();
  followJob();
});

// The operator page: reads fleetrun serve's API every REFRESH_MS and draws what it says.
// Every string from a job goes into the page as text (textContent), never as markup.
"use strict";

const REFRESH_MS = 1000;
const TOKEN_KEY = "fleetrun.api-token";

/** The bearer token, asked of the operator once (when the API answers 401) and kept for the
 *  tab's session; never in the page or a URL. */
let token = sessionStorage.getItem(TOKEN_KEY);
let timer = null;

class Unauthorized extends Error {}

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) {
    throw new Unauthorized();
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error((body && body.error) || `${path}: ${response.status} ${response.statusText}`);
  }
  return body;
}

/** An element with its text (or child nodes) and attributes. */
function el(tag, content, attributes) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    node.setAttribute(name, value);
  }
  if (content instanceof Node) {
    node.append(content);
  } else if (Array.isArray(content)) {
    node.append(...content);
  } else if (content !== undefined && content !== null) {
    node.textContent = String(content);
  }
  return node;
}

function byId(id) {
  return document.getElementById(id);
}

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString();
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function rate(itemsPerSecond) {
  return `${itemsPerSecond < 10 ? itemsPerSecond.toFixed(1) : Math.round(itemsPerSecond)} items/s`;
}

const ENDED = ["Completed", "Failed", "Canceled"];

function stateCell(state) {
  const cell = el("td", state, { class: "state" });
  if (/^\w+$/.test(state)) cell.classList.add("state-" + state);
  return cell;
}

function progressText(counts) {
  const total = counts.total_mini_batches;
  return `${counts.completed_mini_batches} of ${total === null ? "? (listing)" : total} mini-batches`;
}

function progressCell(counts) {
  const bar = el("progress");
  if (counts.total_mini_batches !== null) {
    bar.max = Math.max(1, counts.total_mini_batches);
    bar.value = counts.completed_mini_batches;
  }
  return el("td", [bar, el("span", progressText(counts), { class: "progress-text" })], {
    class: "progress",
  });
}

function eta(job) {
  if (job.eta_seconds !== null) return duration(job.eta_seconds);
  if (job.stalled_since !== null) return `no progress since ${clock(job.stalled_since)}`;
  if (ENDED.includes(job.state)) return "—";
  return "unknown";
}

function count(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

function failures(job) {
  const c = job.counts;
  const parts = [];
  if (c.failed_mini_batches > 0 || c.failed_items > 0) {
    parts.push(`${count(c.failed_mini_batches, "mini-batch", "mini-batches")}, ${count(c.failed_items, "item", "items")}`);
  }
  if (job.cause) parts.push(job.cause);
  return parts.length ? parts.join(": ") : "none";
}

function drawJobs(jobs, selected) {
  const rows = jobs.map((job) => {
    const link = el("a", job.name, { href: "#/jobs/" + encodeURIComponent(job.job_id) });
    const c = job.counts;
    const row = el("tr", [
      el("td", [link, el("div", job.job_id, { class: "quiet" })], { class: "job" }),
      stateCell(job.state),
      progressCell(c),
      el("td", `${c.succeeded_items} succeeded, ${c.failed_items} failed`, {
        class: "items number",
      }),
      el("td", rate(job.items_per_second), { class: "rate number" }),
      el("td", eta(job), { class: "eta" }),
      el("td", failures(job), { class: "failures" }),
      el("td", job.output, { class: "output path" }),
    ]);
    row.dataset.job = job.job_id;
    if (job.job_id === selected) row.classList.add("selected");
    return row;
  });
  document.querySelector("#jobs tbody").replaceChildren(...rows);
  byId("no-jobs").hidden = jobs.length > 0;
}

function drawQueue(queue) {
  byId("pool").textContent = "pool " + queue.pool;
  byId("queue-ready").textContent = queue.ready;
  byId("queue-unacked").textContent =
    queue.unacknowledged === null ? "unknown" : queue.unacknowledged;
  byId("queue-dead").textContent = queue.dead_lettered;
}

function queueUnknown(why) {
  for (const id of ["queue-ready", "queue-unacked", "queue-dead"]) {
    byId(id).textContent = "unknown";
  }
  byId("queue-ready").title = why;
}

/** The job named by the address (`#/jobs/<id>`), if any. */
function selectedJob() {
  const match = /^#\/jobs\/(.+)$/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

function failedItemsText(job) {
  if (job.failed_items) return job.failed_items;
  if (job.counts.failed_items > 0) return "listed in logs/failed_items.csv when the job ends";
  return "none";
}

function storageText(job) {
  const faults = job.storage_faults || [];
  if (faults.length === 0) return "no faults in the last minute";
  return faults
    .map((f) => `${f.message} (${f.nodes} node${f.nodes === 1 ? "" : "s"}, last ${Math.round(f.last_seconds_ago)} s ago)`)
    .join("; ");
}

function drawJob(job, inFlight) {
  byId("job-id").textContent = job.job_id;
  const c = job.counts;
  const facts = [
    ["name", job.name],
    ["state", job.state],
    ["progress", progressText(c)],
    ["items", `${c.succeeded_items} succeeded, ${c.failed_items} failed`],
    ["rate", rate(job.items_per_second)],
    ["ETA", eta(job)],
    ["storage", storageText(job)],
    ["submitted", clock(job.submitted_at)],
    ["cause", job.cause || "none"],
    ["output", job.output],
    ["failed items", failedItemsText(job)],
  ];
  byId("job-facts").replaceChildren(
    ...facts.flatMap(([name, value]) => [el("dt", name), el("dd", value, { class: "fact-" + name.replace(/\W/g, "-") })]),
  );
  const now = Date.now() / 1000;
  const rows = inFlight.map((b) =>
    el("tr", [
      el("td", b.mini_batch, { class: "number" }),
      el("td", b.node),
      el("td", b.process),
      el("td", b.attempt, { class: "number" }),
      el("td", b.started_at === null ? "unknown" : duration(now - b.started_at)),
      el("td", b.first_item === null ? "" : b.first_item, { class: "first-item path" }),
    ]),
  );
  document.querySelector("#in-flight tbody").replaceChildren(...rows);
  byId("none-in-flight").hidden = rows.length > 0;
  byId("job").hidden = false;
}

function problem(text) {
  const p = byId("problem");
  p.textContent = text || "";
  p.hidden = !text;
}

async function refresh() {
  clearTimeout(timer);
  const selected = selectedJob();
  try {
    const [jobs, queue] = await Promise.all([
      api("/v1/jobs"),
      api("/v1/queue").catch((e) => (e instanceof Unauthorized ? Promise.reject(e) : e)),
    ]);
    drawJobs(jobs, selected);
    if (queue instanceof Error) {
      queueUnknown(queue.message);
    } else {
      drawQueue(queue);
    }
    if (selected) {
      const path = "/v1/jobs/" + encodeURIComponent(selected);
      const [job, inFlight] = await Promise.all([api(path), api(path + "/in-flight")]);
      drawJob(job, inFlight);
    } else {
      byId("job").hidden = true;
    }
    problem(null);
    byId("refreshed").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e instanceof Unauthorized) {
      askToken(token ? "That token was refused." : "");
      return;
    }
    problem(e.message);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function askToken(why) {
  byId("login").hidden = false;
  byId("login-problem").textContent = why;
  byId("token").focus();
}

byId("login").addEventListener("submit", (event) => {
  event.preventDefault();
  token = byId("token").value;
  byId("token").value = "";
  sessionStorage.setItem(TOKEN_KEY, token);
  byId("login").hidden = true;
  refresh();
});

document.querySelector("#job .close").addEventListener("click", (event) => {
  event.preventDefault();
  history.replaceState(null, "", location.pathname);
  refresh();
});

window.addEventListener("hashchange", refresh);
refresh();

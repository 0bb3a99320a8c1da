// The Tollgate console: pages over the server's APIs (/v1/overview,
// /v1/config, /v1/top, /v1/usage, /v1/overrides). The token is kept in
// sessionStorage (this tab only) and sent as a bearer token; every value
// from the server is set as text (textContent), never as markup.
"use strict";

const TOKEN = "tollgate-token";
const POLL_MS = 2000;
const state = { page: "overview", access: null, domains: [], timer: null, events: [], lastEvent: 0 };

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, options = {}) {
  const headers = { Authorization: "Bearer " + sessionStorage.getItem(TOKEN) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    cache: "no-store",
  });
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (response.status === 401) {
    signOut("The token was refused.");
    throw new Error("unauthorized");
  }
  return { status: response.status, body };
}

function entriesOf(text) {
  return text.split(/[,&]/).map((part) => part.trim()).filter((part) => part.length > 0).map((part) => {
    const at = part.indexOf("=");
    return at < 0 ? { key: part, value: "" } : { key: part.slice(0, at).trim(), value: part.slice(at + 1).trim() };
  });
}

function keyEntries(key) {
  return key.split(", ").map((part) => {
    const at = part.indexOf("=");
    return at < 0 ? { key: part, value: "" } : { key: part.slice(0, at), value: part.slice(at + 1) };
  });
}

function bar(used, limit) {
  const share = limit > 0 ? Math.min(1, used / limit) : 1;
  const outer = el("span", { class: share >= 1 ? "bar full" : "bar", role: "img", "aria-label": `${used} of ${limit}` });
  const inner = el("span");
  inner.style.width = `${Math.round(share * 100)}%`;
  outer.append(inner);
  return el("span", {}, outer, ` ${used} / ${limit}`);
}

function table(headings, rows) {
  const head = el("thead", {}, el("tr", {}, ...headings.map((heading) => el("th", { scope: "col" }, heading))));
  const body = el("tbody");
  if (rows.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: headings.length }, "none")));
  }
  for (const cells of rows) {
    body.append(el("tr", {}, ...cells.map((cell, at) => el("td", { "data-label": headings[at] }, cell))));
  }
  return el("table", {}, head, body);
}

// A rule's last minute as bars, one per ten seconds: the hits (full height:
// the busiest ten seconds), the part of them near the limit (the bar's lower
// part, in another colour) and a cap when any was refused. The same figures
// are in the label and beside the chart, for readers without colour.
function spark(series) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 60 20");
  svg.setAttribute("role", "img");
  const hits = series.map((point) => point[1]);
  const refused = series.map((point) => point[2]);
  const near = series.map((point) => point[3] || 0);
  svg.setAttribute(
    "aria-label",
    `hits per 10 s: ${hits.join(", ") || "none"}; near the limit: ${near.join(", ") || "none"}; refused: ${refused.join(", ") || "none"}`,
  );
  const most = Math.max(1, ...hits);
  const bar = (kind, at, y, height) => {
    const rect = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    rect.setAttribute("class", kind);
    rect.setAttribute("x", String(at * 10 + 1));
    rect.setAttribute("y", String(y));
    rect.setAttribute("width", "8");
    rect.setAttribute("height", String(height));
    svg.append(rect);
  };
  series.slice(-6).forEach((point, at) => {
    const height = Math.max(point[1] > 0 ? 1 : 0, Math.round((point[1] / most) * 18));
    bar("hits", at, 20 - height, height);
    const nearHits = point[3] || 0;
    if (nearHits > 0) {
      const part = Math.max(1, Math.round((Math.min(nearHits, point[1]) / most) * 18));
      bar("near", at, 20 - part, part);
    }
    if (point[2] > 0) bar("refused", at, 0, 2);
  });
  return svg;
}

// --- Pages. ---------------------------------------------------------------

async function renderOverview() {
  const { body } = await api("/v1/overview");
  if (!body) return;
  state.domains = body.domains.map((pair) => pair[0]);
  const facts = [
    ["Configuration", body.config_source || "(none)"],
    ["Changes since start", body.config_changes],
    ["Last configuration refused", body.last_refused_config ? `${new Date(body.last_refused_config.at_us / 1000).toLocaleString()}: ${body.last_refused_config.text}` : "none since start"],
    ["Domains", body.domains.map((pair) => `${pair[0]} (${pair[1]} rules)`).join(", ") || "(none)"],
    ["Store", body.store + (body.engine ? `, engine: ${body.engine}` : "")],
    ["Health", body.healthy ? "healthy" : "unhealthy"],
    ["Circuit breaker", body.breaker_open === null ? "-" : body.breaker_open ? "open (Redis skipped)" : "closed"],
    ["Persistence", body.persistence || "-"],
    ["Overrides in force", body.overrides],
    ["Alerts", body.alert_webhook ? `to ${body.alert_webhook}, ${body.alerts_waiting} waiting` : "not sent (no webhook)"],
    ["Replicas seen", body.replicas === null ? "-" : body.replicas],
    ["Decisions, last 10 s", await rates()],
    ["p99 latency, last minute", body.p99_ms == null ? "no request" : `at most ${body.p99_ms} ms (${body.requests_last_minute} requests)`],
    ["RLQS streams", body.rlqs_streams],
    ["Signed in as", body.access === "admin" ? "admin" : "read-only"],
  ];
  $("overview").replaceChildren(...facts.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
  fillDomains();
}

// Decisions and refusals per second over the last complete ten seconds,
// every rule of every domain, every replica (from /v1/top's series).
async function rates() {
  let hits = 0;
  let refused = 0;
  const complete = Math.floor(Date.now() / 10000) * 10 - 10;
  for (const domain of state.domains) {
    const { body } = await api(`/v1/top?domain=${encodeURIComponent(domain)}&k=1`);
    for (const rule of (body && body.rules) || []) {
      for (const point of rule.series) {
        if (point[0] === complete) { hits += point[1]; refused += point[2]; }
      }
    }
  }
  return `${(hits / 10).toFixed(1)}/s, refused ${(refused / 10).toFixed(1)}/s`;
}

function fillDomains() {
  for (const id of ["tenant-domain", "o-domain"]) {
    const select = $(id);
    const current = select.value;
    if (select.options.length === state.domains.length) continue;
    select.replaceChildren(...state.domains.map((domain) => el("option", { value: domain }, domain)));
    if (state.domains.includes(current)) select.value = current;
  }
}

function rulesOf(node, out) {
  for (const child of node.descriptors || []) {
    if (child.rule) out.push(child.rule);
    rulesOf(child, out);
  }
  return out;
}

async function renderRules() {
  const config = await fetch("/v1/config", { cache: "no-store" }).then((response) => response.json());
  const blocks = [];
  for (const [name, domain] of Object.entries(config.domains || {})) {
    const { body } = await api(`/v1/top?domain=${encodeURIComponent(name)}&k=1`);
    const series = new Map((body && body.rules ? body.rules : []).map((rule) => [rule.rule, rule.series]));
    const rows = rulesOf(domain, []).map((rule) => {
      const flags = el("span");
      if (rule.shadow_mode) flags.append(el("span", { class: "flag" }, "shadow"));
      if (rule.limit === "unlimited") flags.append(el("span", { class: "flag" }, "unlimited"));
      if (rule.limit === "blocked") flags.append(el("span", { class: "flag" }, "blocks"));
      if ((rule.replaces || []).length) flags.append(el("span", { class: "flag" }, "replaces " + rule.replaces.join(", ")));
      const limit = typeof rule.limit === "object" ? rule.limit : null;
      const points = series.get(rule.path) || [];
      const hits = points.reduce((sum, point) => sum + point[1], 0);
      const refused = points.reduce((sum, point) => sum + point[2], 0);
      const near = points.reduce((sum, point) => sum + (point[3] || 0), 0);
      return [
        rule.path,
        rule.name || "-",
        rule.requests_per_unit !== null && rule.unit ? `${rule.requests_per_unit}/${rule.unit}` : "-",
        limit ? limit.algorithm : "-",
        flags,
        el("span", {}, spark(points), ` ${hits} hits, ${near} near the limit, ${refused} refused`),
      ];
    });
    blocks.push(el("h3", {}, name), table(["Rule", "Name", "Limit", "Algorithm", "Flags", "Last minute"], rows));
  }
  $("rules").replaceChildren(...blocks);
}

async function usageOf(domain, keys) {
  if (keys.length === 0) return new Map();
  const descriptors = keys.map((key) => ({ entries: keyEntries(key) }));
  const { status, body } = await api("/v1/usage", { method: "POST", body: { domain, descriptors } });
  if (status !== 200 || !body) return new Map();
  return new Map(keys.map((key, at) => [key, body.usage[at]]));
}

function usageCell(usage) {
  if (!usage || usage.limit === null || usage.limit === undefined) return "-";
  return el("span", {}, bar(usage.used, usage.limit), usage.reset_after_ms !== null ? ` resets in ${Math.ceil(usage.reset_after_ms / 1000)} s` : "");
}

async function renderTop() {
  const blocks = [];
  for (const domain of state.domains) {
    const { body } = await api(`/v1/top?domain=${encodeURIComponent(domain)}&k=10`);
    for (const rule of (body && body.rules) || []) {
      const keys = [...new Set([...rule.hits, ...rule.refusals].map((heavy) => heavy.key))];
      const usage = await usageOf(domain, keys);
      const rows = (list) => list.map((heavy) => [heavy.key, heavy.count, `${heavy.min}–${heavy.max}`, usageCell(usage.get(heavy.key))]);
      blocks.push(
        el("h3", {}, `${domain} · ${rule.rule}`),
        el("p", { class: "hint" }, `By hits (any other at most ${rule.hits_unlisted})`),
        table(["Descriptor", "Hits", "Bounds", "Usage"], rows(rule.hits)),
        el("p", { class: "hint" }, `By refusals (any other at most ${rule.refusals_unlisted})`),
        table(["Descriptor", "Refused", "Bounds", "Usage"], rows(rule.refusals)),
      );
    }
  }
  if (blocks.length === 0) blocks.push(el("p", { class: "hint" }, "No decision in the last minute."));
  $("top").replaceChildren(...blocks);
}

async function renderTenant() {
  const domain = $("tenant-domain").value;
  const text = $("tenant-entries").value;
  if (!domain || !text) return;
  const query = new URLSearchParams([["domain", domain], ...entriesOf(text).map((entry) => [entry.key, entry.value])]);
  const { status, body } = await api(`/v1/usage?${query}`);
  if (status !== 200) {
    $("tenant-error").textContent = (body && body.error) || `error ${status}`;
    $("tenant").replaceChildren();
    return;
  }
  $("tenant-error").textContent = "";
  const rows = body.usage.map((usage) => [
    usage.descriptor.map((entry) => `${entry.key}=${entry.value}`).join(", "),
    usage.rule || "-",
    usage.unlimited ? "unlimited" : usage.limit === null ? "-" : `${usage.limit}${usage.unit ? "/" + usage.unit : ""}`,
    usage.limit === null ? "-" : bar(usage.used, usage.limit),
    usage.remaining === null ? "-" : usage.remaining,
    usage.resets_at || "-",
    usage.override ? "override" : usage.shadow_mode ? "shadow" : "",
  ]);
  const varying = (body.varying || []).map((rule) => el("li", {}, `${rule.rule}: ${rule.descriptor.map((entry) => `${entry.key}=${entry.value === null ? "*" : entry.value}`).join(", ")}`));
  $("tenant").replaceChildren(
    table(["Descriptor", "Rule", "Limit", "Used", "Remaining", "Resets at", "Flags"], rows),
    varying.length ? el("p", { class: "hint" }, "Rules below it whose values vary:") : "",
    varying.length ? el("ul", {}, ...varying) : "",
  );
}

async function renderOverrides() {
  const { body } = await api("/v1/overrides");
  const rows = ((body && body.overrides) || []).map((stored) => {
    const descriptor = stored.descriptor.map((entry) => `${entry.key}=${entry.value}`).join(", ");
    const remove = el("button", { type: "button" }, "Delete");
    remove.disabled = state.access !== "admin";
    remove.addEventListener("click", async () => {
      const { status, body: answer } = await api("/v1/overrides", { method: "DELETE", body: { domain: stored.domain, descriptor: stored.descriptor } });
      if (status !== 200) $("override-error").textContent = (answer && answer.error) || `error ${status}`;
      renderOverrides();
    });
    return [stored.domain, descriptor, JSON.stringify(stored.rate_limit || stored.algorithm || {}), stored.expires_at || "-", stored.reason || "-", remove];
  });
  $("overrides").replaceChildren(rows.length ? table(["Domain", "Descriptor", "Limit", "Ends", "Reason", ""], rows) : el("p", { class: "hint" }, "No override in force."));
  $("override-form").hidden = state.access !== "admin";
}

async function renderEvents() {
  const { body } = await api(`/v1/events?after=${state.lastEvent}`);
  const fresh = (body && body.events) || [];
  if (fresh.length) {
    state.lastEvent = fresh[0].id;
    state.events = fresh.concat(state.events).slice(0, 500);
  }
  $("events").replaceChildren(...state.events.map((event) => {
    const at = new Date(event.at_us / 1000).toISOString();
    return el("li", { class: event.kind === "config_refused" ? "error" : "" }, el("time", { datetime: at }, at), " ", event.text);
  }));
}

async function setOverride(event) {
  event.preventDefault();
  for (const span of document.querySelectorAll("#override-form .error")) span.textContent = "";
  const rateLimit = {};
  if ($("o-requests").value) rateLimit.requests_per_unit = Number($("o-requests").value);
  if ($("o-unit").value) rateLimit.unit = $("o-unit").value;
  const request = { domain: $("o-domain").value, descriptor: entriesOf($("o-entries").value), rate_limit: rateLimit };
  if ($("o-algorithm").value) {
    try { request.rate_limit.algorithm = JSON.parse($("o-algorithm").value); } catch (_) {
      document.querySelector('[data-for="algorithm"]').textContent = "not JSON";
      return;
    }
  }
  if ($("o-ttl").value) request.ttl = $("o-ttl").value;
  if ($("o-reason").value) request.reason = $("o-reason").value;
  const { status, body } = await api("/v1/overrides", { method: "PUT", body: request });
  if (status === 200) {
    renderOverrides();
    return;
  }
  const message = (body && body.error) || `error ${status}`;
  const field = [...document.querySelectorAll("#override-form [data-for]")]
    .map((span) => span.getAttribute("data-for"))
    .sort((a, b) => b.length - a.length)
    .find((name) => message.startsWith(name) || message.startsWith("rate_limit." + name));
  const target = field ? document.querySelector(`#override-form [data-for="${field}"]`) : $("override-error");
  target.textContent = message;
}

const RENDER = { overview: renderOverview, rules: renderRules, top: renderTop, tenant: renderTenant, overrides: renderOverrides, events: renderEvents };

async function refresh() {
  if (document.visibilityState !== "visible" || !sessionStorage.getItem(TOKEN)) return;
  try {
    if (state.page !== "overview") await renderOverview();
    await RENDER[state.page]();
  } catch (error) {
    if (error.message !== "unauthorized") console.warn(error);
  }
}

function show(page) {
  state.page = page;
  for (const button of document.querySelectorAll("nav [data-page]")) {
    if (button.dataset.page === page) button.setAttribute("aria-current", "page");
    else button.removeAttribute("aria-current");
  }
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== `page-${page}`;
  refresh();
}

function start() {
  $("signin").hidden = true;
  $("app").hidden = false;
  $("who").textContent = state.access === "admin" ? "admin" : "read-only";
  show("overview");
  clearInterval(state.timer);
  state.timer = setInterval(refresh, POLL_MS);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN);
  clearInterval(state.timer);
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message || "";
}

async function signIn(event) {
  event.preventDefault();
  sessionStorage.setItem(TOKEN, $("token").value);
  $("token").value = "";
  let answer;
  try { answer = await api("/v1/overview"); } catch (_) { return; }
  if (answer.status !== 200) {
    signOut((answer.body && answer.body.error) || `error ${answer.status}`);
    return;
  }
  state.access = answer.body.access;
  start();
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", signIn);
  $("signout").addEventListener("click", () => signOut(""));
  $("tenant-form").addEventListener("submit", (event) => { event.preventDefault(); renderTenant(); });
  $("override-form").addEventListener("submit", setOverride);
  for (const button of document.querySelectorAll("nav [data-page]")) {
    button.addEventListener("click", () => show(button.dataset.page));
  }
  document.addEventListener("visibilitychange", refresh);
  if (sessionStorage.getItem(TOKEN)) {
    api("/v1/overview").then((answer) => {
      if (answer.status === 200) { state.access = answer.body.access; start(); }
    }).catch(() => {});
  }
});

// The storefront's and the console's script: plain browser JavaScript, no
// build step. Both pages read one event stream of the service's live
// figures and call the JSON API with the bearer token kept in this tab.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const TOKEN_KEY = "seckill-token";

// The server's clock as this page knows it: countdowns are judged by it,
// not by the browser's clock.
let clockOffsetMs = 0;
const serverNow = () => Date.now() + clockOffsetMs;

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(method, path, { body, headers = {} } = {}) {
  const init = { method, headers: { ...headers } };
  if (token()) init.headers.Authorization = "Bearer " + token();
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    return { status: 0, body: { code: "unreachable", message: "the service did not answer" } };
  }
  let parsed = null;
  try { parsed = await response.json(); } catch (e) { parsed = null; }
  return { status: response.status, body: parsed, retryAfter: response.headers.get("Retry-After") };
}

// Reads a server-sent-event stream with fetch (so that it can carry the
// bearer token) and calls onFigures with each event's JSON; reconnects
// after a pause when the stream ends. onRefused gets a 401/403 and ends it.
function follow(path, { onFigures, onState, onRefused }) {
  let stopped = false;
  async function run() {
    while (!stopped) {
      try {
        const headers = token() ? { Authorization: "Bearer " + token() } : {};
        const response = await fetch(path, { headers });
        if (response.status === 401 || response.status === 403) {
          const body = await response.json().catch(() => ({}));
          onRefused(response.status, body);
          return;
        }
        if (!response.ok || !response.body) throw new Error("status " + response.status);
        onState("live");
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            const data = block.split("\n").filter((l) => l.startsWith("data:"))
              .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
            if (data) onFigures(JSON.parse(data));
          }
        }
      } catch (e) {
        // fall through to the pause
      }
      onState("reconnecting");
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
  run();
  return () => { stopped = true; };
}

function fmtDuration(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const two = (n) => String(n).padStart(2, "0");
  return (h ? h + ":" + two(m) : String(m)) + ":" + two(sec);
}

// An amount in minor units as the buyer's locale writes it ("¥19.90",
// "€5.00"), with the currency's ISO 4217 decimals (`exponent`): whole
// numbers on the wire, so nothing is rounded on the way.
function fmtMoney(minor, currency, exponent) {
  if (currency === "XXX") return minor === 0 ? "Free" : String(minor);
  const digits = { minimumFractionDigits: exponent, maximumFractionDigits: exponent };
  try {
    return new Intl.NumberFormat(undefined, { style: "currency", currency, ...digits }).format(minor / 10 ** exponent);
  } catch (e) {
    return (minor / 10 ** exponent).toFixed(exponent) + " " + currency;
  }
}

// A sale's window with its day (a 24-hour sale would otherwise read
// "9:24:45 AM – 9:24:45 AM"); the end's day only when it is another one.
function fmtWindow(beginMs, endMs) {
  const begin = new Date(beginMs), end = new Date(endMs);
  const sameDay = begin.toLocaleDateString() === end.toLocaleDateString();
  return begin.toLocaleString() + " – " + (sameDay ? end.toLocaleTimeString() : end.toLocaleString());
}

function saleStatus(sale, now) {
  if (now < sale.begin_ms) return "coming";
  if (now >= sale.end_ms) return "ended";
  if (sale.stock_left <= 0) return "sold out";
  return "open";
}

function setMessage(el, text, kind) {
  el.textContent = text;
  el.className = el.className.replace(/\b(ok|error)\b/g, "").trim() + (kind ? " " + kind : "");
}

// Who the kept token speaks for, as the server says (a token is opaque to
// the page): null without one, a phrase otherwise.
async function whoIsSignedIn() {
  if (!token()) return null;
  const answer = await api("GET", "/api/me");
  if (answer.status !== 200 || !answer.body) return "a token the server refuses";
  return answer.body.role === "operator" ? "the operator" : "user " + answer.body.user_id;
}

function setUpSignIn(onChange) {
  const show = async () => {
    const who = await whoIsSignedIn();
    $("#who").textContent = who ? "Signed in as " + who + "." : $("#who").dataset.anonymous;
    $("#sign-out").hidden = !token();
  };
  $("#sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    setMessage($("#sign-in-message"), "Signed out.", "ok");
    show();
    onChange();
  });
  $("#who").dataset.anonymous = $("#who").textContent;
  $("#token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
    $("#token").value = "";
    show();
    onChange();
  });
  $("#demo-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const user = $("#demo-user");
    const body = user ? { user_id: Number(user.value) } : { operator: true };
    const answer = await api("POST", "/api/demo/sign-in", { body });
    if (answer.status === 200) {
      sessionStorage.setItem(TOKEN_KEY, answer.body.token);
      setMessage($("#sign-in-message"), "", null);
      show();
      onChange();
    } else if (answer.status === 404) {
      setMessage($("#sign-in-message"), "Demo sign-in is not enabled on this server: paste a token.", "error");
    } else {
      setMessage($("#sign-in-message"), (answer.body && answer.body.message) || "sign-in failed", "error");
    }
  });
  show();
}

// ---------------------------------------------------------------- storefront

const REFUSALS = {
  sold_out: "Sold out.",
  already_bought: "You already bought this.",
  sale_not_started: "Not started yet.",
  sale_ended: "The sale has ended.",
  purchase_in_progress: "Your purchase is in progress.",
  unknown_voucher: "No such sale.",
};

// What a refused waiting-room pass means to the buyer (all 403).
const PASS_REFUSALS = {
  pass_required: "This sale has a waiting room: join the line, and buy when your turn comes.",
  pass_expired: "Your turn ran out: the pass is no longer valid.",
  pass_invalid: "Your pass is no longer valid: join the line again.",
  pass_not_yours: "That pass belongs to someone else.",
  pass_other_sale: "That pass is for another sale.",
};

// What a refused payment or cancellation means to the buyer.
const ORDER_REFUSALS = {
  already_paid: "This order is already paid.",
  order_cancelled: "This order was cancelled.",
  order_expired: "The time to pay ran out: the order has expired and the unit is back on sale.",
  order_pending: "Your order is still being recorded: try again in a moment.",
  order_failed: "This order could not be recorded.",
  payment_declined: "The payment was declined: nothing was charged.",
  order_used: "This order was used at the shop: it cannot be refunded.",
  order_refunding: "A refund of this order is under way.",
  order_refunded: "This order was refunded.",
  order_not_paid: "This order is not paid: there is nothing to refund.",
};

// What a 503 or a lost answer means to the buyer, by the API's code. Only
// a purchase refused before it was made ("sale_repairing") is known not
// to have happened; otherwise the order shows on the page if it did.
const OUTAGES = {
  sale_repairing: "The sale is being checked after an outage: nothing was bought.",
  not_replicated: "Your purchase may have gone through: if it did, your order shows here shortly.",
  unreachable: "The shop did not answer: check your connection. If your purchase went through, your order shows here.",
  unavailable: "The shop is having trouble right now. If your purchase went through, your order shows here.",
};

// How long to wait before asking again after a 503 or a 429: the server's
// Retry-After (seconds), within reason.
function retryAfterMs(answer) {
  const seconds = Number(answer.retryAfter);
  return Math.min(60, Math.max(1, Number.isFinite(seconds) && seconds > 0 ? seconds : 2)) * 1000;
}

function storefront() {
  const cards = new Map(); // voucher id -> { el, sale, clicked, order }
  const mine = new Map(); // voucher id -> the buyer's latest stored order
  let latest = [];
  // Whether the figures shown are current: the stream is live and the
  // server read its stores for them (it keeps the last figures, and says
  // so, while a store is down).
  let live = false;
  let figuresCurrent = true;
  let figuresAsOf = 0;

  // The buyer's stored orders, in one request (not one per sale).
  async function loadMine() {
    mine.clear();
    if (!token()) return;
    const answer = await api("GET", "/api/orders");
    if (answer.status !== 200) return;
    for (const order of answer.body) {
      const seen = mine.get(order.voucher_id);
      if (!seen || BigInt(order.order_id) > BigInt(seen.order_id)) mine.set(order.voucher_id, order);
    }
    for (const [id, entry] of cards) {
      entry.order = mine.get(id) || null;
      if (entry.order && entry.order.state === "pending") watchOrder(entry);
      if (entry.sale.waiting_room) loadStanding(entry);
    }
    render();
  }

  // Where this buyer stands in a sale's waiting room (and their pass once
  // admitted). Asked when the card appears, on joining, when the live
  // line says the draw was made or their turn came: not every tick.
  async function loadStanding(entry) {
    if (!token() || entry.asking) return;
    entry.asking = true;
    const answer = await api("GET", "/api/vouchers/" + entry.sale.id + "/room");
    entry.asking = false;
    if (answer.status === 200) entry.room = answer.body;
    paint(entry, serverNow());
  }

  async function joinRoom(entry) {
    const outcome = $(".outcome", entry.el);
    if (!token()) return setMessage(outcome, "Sign in first.", "error");
    const answer = await api("POST", "/api/vouchers/" + entry.sale.id + "/room");
    if (answer.status === 200) {
      entry.room = answer.body;
      setMessage(outcome, "", null);
    } else {
      const code = answer.body && answer.body.code;
      setMessage(outcome, answer.status === 0 ? OUTAGES.unreachable : OUTAGES[code] || OUTAGES.unavailable, "error");
    }
    paint(entry, serverNow());
  }

  // The room's line as this buyer sees it, from their standing and the
  // live figures' line (which moves every tick for everyone at once).
  function paintRoom(entry, now) {
    const { el, sale } = entry;
    const room = sale.waiting_room;
    const box = $(".room", el);
    box.hidden = !room;
    if (!room) return { gated: false };
    const line = room.line || null;
    const standing = entry.room;
    let state = standing ? standing.state : "outside";
    // Sold out reaches everyone in line with the live figures, at once.
    if (sale.stock_left <= 0 && ["awaiting_draw", "waiting"].includes(state)) state = "sold_out";
    let text;
    let canJoin = false;
    if (state === "outside" || state === "not_open") {
      canJoin = now >= room.opens_ms && now < sale.end_ms;
      text = now < room.opens_ms
        ? "A waiting room opens " + fmtDuration(room.opens_ms - now) + " before this sale: join it then."
        : "This sale has a waiting room. Join the line: everyone who joins before the sale starts gets a place drawn at random.";
    } else if (state === "awaiting_draw") {
      if (line && line.drawn) loadStanding(entry);
      const waiting = line ? line.awaiting_draw : null;
      text = "You are in the line. Places are drawn at random when the sale starts"
        + (waiting ? " (" + waiting + " people so far)." : ".");
    } else if (state === "waiting") {
      const through = line ? Math.max(line.admitted_through, standing.admitted_through) : standing.admitted_through;
      const ahead = Math.max(0, standing.ticket - through - 1);
      if (standing.ticket <= through) loadStanding(entry);
      text = "Your place: " + standing.ticket + ". " + (ahead === 0 ? "You are next."
        : ahead + (ahead === 1 ? " person" : " people") + " ahead of you, about "
          + fmtDuration(Math.ceil((ahead + 1) / Math.max(1, room.admit_per_s)) * 1000) + ".")
        + (room.paused ? " The line is paused for now." : "");
    } else if (state === "admitted") {
      const left = standing.pass_until_ms - now;
      if (left <= 0) loadStanding(entry);
      text = "Your turn: buy within " + fmtDuration(Math.max(0, left)) + ".";
    } else if (state === "sold_out") {
      text = "Sold out while you waited: if a unit comes back, the line moves again.";
    } else {
      text = "Your turn in this line has passed.";
    }
    $(".room-line", el).textContent = text;
    $(".join", el).hidden = !canJoin;
    return { gated: state !== "admitted", pass: state === "admitted" ? standing.pass : null };
  }

  function card(sale) {
    let entry = cards.get(sale.id);
    if (!entry) {
      const el = $("#sale-card").content.firstElementChild.cloneNode(true);
      el.dataset.id = sale.id;
      $(".buy", el).addEventListener("click", () => buy(entry));
      $(".pay", el).addEventListener("click", () => act(entry, "pay"));
      $(".cancel", el).addEventListener("click", () => act(entry, "cancel"));
      $(".refund", el).addEventListener("click", () => act(entry, "refund"));
      $(".join", el).addEventListener("click", () => joinRoom(entry));
      entry = { el, sale, clicked: false, order: mine.get(sale.id) || null, busy: false, room: null };
      if (sale.waiting_room) loadStanding(entry);
      cards.set(sale.id, entry);
    }
    entry.sale = sale;
    return entry;
  }

  function render() {
    const now = serverNow();
    const shown = latest.filter((s) => now < s.end_ms);
    const container = $("#sales");
    const wanted = shown.map((s) => card(s).el);
    if (wanted.length !== container.children.length || wanted.some((el, i) => container.children[i] !== el)) {
      container.replaceChildren(...wanted);
    }
    if (!shown.length) container.textContent = "No sale is open or coming.";
    for (const sale of shown) paint(cards.get(sale.id), now);
  }

  function paint(entry, now) {
    const { el, sale } = entry;
    // The deadline passed (by the server's clock): the order is expired,
    // whether or not the server's sweep has recorded it yet; ask it.
    if (entry.order && entry.order.state === "reserved" && entry.order.pay_by_ms && now >= entry.order.pay_by_ms) {
      entry.order = { ...entry.order, state: "expired" };
      entry.clicked = false;
      setMessage($(".outcome", el), ORDER_REFUSALS.order_expired, "error");
      setTimeout(() => loadOrder(entry), 1000);
    }
    const status = saleStatus(sale, now);
    $(".title", el).textContent = sale.title;
    $(".shop", el).textContent = sale.shop ? sale.shop.name : "";
    $(".shop", el).hidden = !sale.shop;
    $(".subtitle", el).textContent = sale.subtitle;
    $(".subtitle", el).hidden = !sale.subtitle;
    $(".price-now", el).textContent = sale.price_minor === 0 && sale.face_value_minor === 0
      ? "Free" : fmtMoney(sale.price_minor, sale.currency, sale.currency_exponent);
    $(".face-value", el).textContent = sale.face_value_minor > sale.price_minor
      ? "worth " + fmtMoney(sale.face_value_minor, sale.currency, sale.currency_exponent) : "";
    $(".rules-text", el).textContent = sale.rules;
    $(".rules", el).hidden = !sale.rules;
    const stale = !live || !figuresCurrent;
    const stock = sale.stock_left > 0 ? sale.stock_left + " left" : "Sold out";
    $(".stock", el).textContent = stale
      ? stock + " when last seen" + (figuresAsOf > 0 ? " at " + new Date(figuresAsOf).toLocaleTimeString() : "") + " (not current)"
      : stock;
    $(".stock", el).classList.toggle("stale", stale);
    el.classList.toggle("sold-out", sale.stock_left <= 0);
    el.dataset.status = status;
    $(".countdown", el).textContent =
      status === "coming" ? "Starts in " + fmtDuration(sale.begin_ms - now)
        : status === "ended" ? "Ended"
          : "Ends in " + fmtDuration(sale.end_ms - now);
    const button = $(".buy", el);
    const holds = entry.order && entry.order.state !== "failed" && !entry.order.unit_returned;
    const room = paintRoom(entry, now);
    // Behind a room, Buy waits for the buyer's turn (the server refuses
    // it before anyway).
    const roomWaits = room.gated && !holds && status === "open";
    // After a 503 or a 429 the button waits as long as the server asked;
    // the countdown is on the button, not in the announced message.
    const waitMs = entry.retryAt ? entry.retryAt - Date.now() : 0;
    button.disabled = entry.clicked || entry.busy || holds || status !== "open" || waitMs > 0 || roomWaits;
    button.textContent = status === "sold out" ? "Sold out" : holds ? "Bought"
      : waitMs > 0 ? "Try again in " + Math.ceil(waitMs / 1000) + " s"
        : roomWaits ? "Buy (when your turn comes)" : "Buy";
    const order = $(".order", el);
    order.hidden = !entry.order;
    if (entry.order) {
      $(".order-id", el).textContent = entry.order.order_id;
      $(".order-state", el).textContent = entry.order.state;
      $(".order-amount", el).textContent = entry.order.currency && entry.order.amount_minor > 0
        ? fmtMoney(entry.order.amount_minor, entry.order.currency, sale.currency_exponent) : "";
      $(".order-deadline", el).textContent = entry.order.state === "reserved" && entry.order.pay_by_ms
        ? "(pay within " + fmtDuration(entry.order.pay_by_ms - now) + ")" : "";
      const reserved = entry.order.state === "reserved";
      $(".pay", el).hidden = !reserved;
      $(".cancel", el).hidden = !reserved;
      $(".pay", el).disabled = entry.busy;
      $(".cancel", el).disabled = entry.busy;
      const paid = entry.order.state === "paid";
      $(".redeem", el).hidden = !paid || !entry.order.redeem_code;
      $(".redeem-code", el).textContent = entry.order.redeem_code || "";
      $(".refund", el).hidden = !paid;
      $(".refund", el).disabled = entry.busy;
    }
  }

  async function buy(entry) {
    if (entry.clicked) return;
    entry.clicked = true; // pressed once: the answer decides whether it comes back
    paint(entry, serverNow());
    const outcome = $(".outcome", entry.el);
    if (!token()) {
      setMessage(outcome, "Sign in first.", "error");
      entry.clicked = false;
      return paint(entry, serverNow());
    }
    setMessage(outcome, "Buying…", null);
    const pass = entry.room && entry.room.state === "admitted" ? entry.room.pass : null;
    const headers = pass ? { "Room-Pass": pass } : {};
    const answer = await api("POST", "/api/vouchers/" + entry.sale.id + "/seckill", { headers });
    const code = answer.body && answer.body.code;
    if (answer.status === 200) {
      if (pass) loadStanding(entry);
      setMessage(outcome, "Accepted: your order is " + answer.body.state + ".", "ok");
      entry.order = { order_id: answer.body.order_id, state: answer.body.state };
      watchOrder(entry);
    } else if (answer.status === 409 && REFUSALS[code]) {
      setMessage(outcome, REFUSALS[code], "error");
      if (code === "already_bought" || code === "purchase_in_progress") loadOrder(entry);
    } else if (answer.status === 403 && PASS_REFUSALS[code]) {
      setMessage(outcome, PASS_REFUSALS[code], "error");
      entry.clicked = false;
      loadStanding(entry);
    } else if (answer.status === 429) {
      setMessage(outcome, "Too many requests at once: nothing was bought.", "error");
      entry.retryAt = Date.now() + retryAfterMs(answer);
      entry.clicked = false;
    } else if (answer.status === 401) {
      setMessage(outcome, "Your token was refused: sign in again.", "error");
      entry.clicked = false;
    } else {
      // A 503 or a lost answer: the purchase may or may not have happened
      // (the code says which), so the page asks for the order too.
      const known = answer.status === 0 ? "unreachable" : code;
      setMessage(outcome, OUTAGES[known] || OUTAGES.unavailable, "error");
      entry.retryAt = Date.now() + retryAfterMs(answer);
      entry.clicked = false;
      loadOrder(entry);
    }
    paint(entry, serverNow());
  }

  async function loadOrder(entry) {
    const answer = await api("GET", "/api/vouchers/" + entry.sale.id + "/order");
    if (answer.status === 200) {
      entry.order = answer.body;
      paint(entry, serverNow());
      if (entry.order.state === "pending") watchOrder(entry);
    }
  }

  // An accepted order is on its way to the database: ask until it is there.
  async function watchOrder(entry) {
    let waited = false;
    for (let i = 0; i < 120 && entry.order && entry.order.state === "pending"; i++) {
      waited = true;
      await new Promise((r) => setTimeout(r, 500));
      const answer = await api("GET", "/api/vouchers/" + entry.sale.id + "/order");
      if (answer.status === 200) entry.order = answer.body;
      paint(entry, serverNow());
    }
    // Stored: the order's own line says its state from now on.
    const outcome = $(".outcome", entry.el);
    if (waited && entry.order && entry.order.state !== "pending" && outcome.textContent.startsWith("Accepted")) {
      setMessage(outcome, "", null);
    }
  }

  async function act(entry, what) {
    entry.busy = true;
    paint(entry, serverNow());
    // One key per order and action: a retry after a lost answer is the
    // same payment or refund, never a second one.
    const keys = entry.keys || (entry.keys = {});
    const slot = what + ":" + entry.order.order_id;
    const headers = what === "cancel" ? {} : { "Idempotency-Key": keys[slot] || (keys[slot] = crypto.randomUUID()) };
    const answer = await api("POST", "/api/orders/" + entry.order.order_id + "/" + what, { headers });
    const outcome = $(".outcome", entry.el);
    if (answer.status === 200) {
      entry.order = answer.body;
      if (what !== "pay") entry.clicked = false; // the voucher decides whether it can be bought again
      const done = {
        pay: "Paid.",
        cancel: "Cancelled: the unit is back on sale.",
        refund: "Refunded.",
      };
      setMessage(outcome, done[what], "ok");
    } else {
      const code = answer.body && answer.body.code;
      const outage = answer.status === 0 ? OUTAGES.unreachable
        : "The shop is having trouble right now: try again in " + Math.ceil(retryAfterMs(answer) / 1000) + " s.";
      setMessage(outcome, ORDER_REFUSALS[code] || outage, "error");
      if (answer.status === 409) loadOrder(entry);
    }
    entry.busy = false;
    paint(entry, serverNow());
  }

  setUpSignIn(() => {
    for (const entry of cards.values()) { entry.order = null; entry.clicked = false; }
    loadMine();
  });
  loadMine();
  follow("/api/live", {
    onFigures(snapshot) {
      clockOffsetMs = snapshot.now_ms - Date.now();
      latest = snapshot.sales;
      figuresCurrent = snapshot.current !== false;
      figuresAsOf = snapshot.as_of_ms;
      render();
    },
    onState(state) {
      live = state === "live";
      setMessage($("#connection"), live ? "" : "Reconnecting: the figures shown are not current.", live ? null : "error");
      render();
    },
    onRefused() {},
  });
  setInterval(render, 250);
}

// ------------------------------------------------------------------ console

function consolePage() {
  let stop = null;
  let latest = [];

  function start() {
    if (stop) stop();
    $("#denied").hidden = true;
    if (!token()) return;
    stop = follow("/api/admin/live", {
      onFigures(snapshot) {
        clockOffsetMs = snapshot.now_ms - Date.now();
        $("#console").hidden = false;
        paintFigures(snapshot);
        latest = snapshot.sales;
        paintSales();
      },
      onState(state) {
        setMessage($("#connection"), state === "live" ? "Live." : "Reconnecting…", state === "live" ? "ok" : "error");
      },
      onRefused(status, body) {
        $("#console").hidden = true;
        $("#denied").hidden = false;
        $("#denied").textContent = status === 403
          ? "This token is not an operator's: the console needs an operator's token."
          : "Token refused (" + ((body && body.message) || status) + "): sign in again.";
      },
    });
  }

  function paintFigures(snapshot) {
    $("#h-redis").textContent = snapshot.redis;
    $("#h-database").textContent = snapshot.database;
    for (const [name, value] of Object.entries(snapshot.instance)) {
      const el = document.getElementById("f-" + name);
      if (el) el.textContent = String(value);
    }
  }

  function paintSales() {
    const now = serverNow();
    const rows = latest.map((sale) => {
      const tr = document.createElement("tr");
      tr.dataset.id = sale.id;
      const price = sale.price_minor === 0 ? "Free" : fmtMoney(sale.price_minor, sale.currency, sale.currency_exponent);
      const room = sale.waiting_room;
      const line = room && room.line;
      const waiting = line ? line.last_ticket - line.admitted_through + line.awaiting_draw : 0;
      const roomText = !room ? "none" : room.admit_per_s + "/s, " + waiting + " waiting"
        + (line ? ", " + line.admitted_through + " admitted" : "") + (room.paused ? ", paused" : "");
      const cells = [sale.id, sale.title, price, sale.stock_left, saleStatus(sale, now),
        fmtWindow(sale.begin_ms, sale.end_ms), roomText];
      const classes = ["id", "title", "price", "stock-left", "status", "window", "room"];
      cells.forEach((text, i) => {
        const td = document.createElement("td");
        td.className = classes[i];
        td.textContent = String(text);
        tr.appendChild(td);
      });
      return tr;
    });
    $("#console-sales").replaceChildren(...rows);
  }

  // The form's input for each field the API names in a refusal.
  const FORM_FIELDS = {
    title: "#new-title", stock: "#new-stock", begin_ms: "#new-starts-in", end_ms: "#new-lasts",
    pay_within_ms: "#new-pay-within", price_minor: "#new-price", face_value_minor: "#new-face-value",
    currency: "#new-currency", admit_per_s: "#new-room-rate",
  };
  const clearRefusal = () => {
    for (const input of document.querySelectorAll("#create-form [aria-invalid]")) input.removeAttribute("aria-invalid");
    if ($("#created").classList.contains("error")) setMessage($("#created"), "", null);
  };
  // An old refusal goes as soon as the form is changed.
  $("#create-form").addEventListener("input", clearRefusal);

  $("#create-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    clearRefusal();
    const begin = serverNow() + Number($("#new-starts-in").value) * 1000;
    const body = {
      title: $("#new-title").value,
      stock: Number($("#new-stock").value),
      begin_ms: Math.round(begin),
      end_ms: Math.round(begin + Number($("#new-lasts").value) * 60000),
      pay_within_ms: Number($("#new-pay-within").value) * 60000,
      price_minor: Number($("#new-price").value),
    };
    if ($("#new-face-value").value !== "") body.face_value_minor = Number($("#new-face-value").value);
    if ($("#new-currency").value !== "") body.currency = $("#new-currency").value;
    if ($("#new-room-rate").value !== "") body.waiting_room = { admit_per_s: Number($("#new-room-rate").value) };
    const answer = await api("POST", "/api/vouchers", { body });
    if (answer.status === 201) {
      setMessage($("#created"), "Created sale " + answer.body.id + ".", "ok");
    } else {
      // A refusal names its field: said with the field's label, and the
      // field marked and focused.
      const input = answer.body && answer.body.field && $(FORM_FIELDS[answer.body.field] || "#none");
      const label = input && input.closest("label") ? input.closest("label").firstChild.textContent.trim() + ": " : "";
      setMessage($("#created"), label + ((answer.body && answer.body.message) || "not created (" + answer.status + ")"), "error");
      if (input) {
        input.setAttribute("aria-invalid", "true");
        input.focus();
      }
    }
  });

  // A sale's waiting room: set (with the rate given), paused, resumed or
  // removed; the other settings are kept as the live figures show them.
  async function room(action) {
    const id = Number($("#room-sale").value);
    const sale = latest.find((s) => s.id === id);
    const current = sale && sale.waiting_room;
    const path = "/api/vouchers/" + id + "/room";
    let answer;
    if (action === "remove") {
      answer = await api("DELETE", path);
    } else {
      const settings = current
        ? { admit_per_s: current.admit_per_s, opens_before_ms: current.opens_before_ms, pass_ttl_ms: current.pass_ttl_ms, paused: current.paused }
        : { admit_per_s: Number($("#room-rate").value) };
      if (current && current.max_active !== null && current.max_active !== undefined) settings.max_active = current.max_active;
      if (action === "set") settings.admit_per_s = Number($("#room-rate").value);
      if (action === "pause") settings.paused = true;
      if (action === "resume") settings.paused = false;
      answer = await api("PUT", path, { body: settings });
    }
    const done = { set: "Waiting room set.", pause: "Admission paused.", resume: "Admission resumed.", remove: "Waiting room removed." };
    if (answer.status === 200 || answer.status === 204) setMessage($("#room-message"), done[action], "ok");
    else setMessage($("#room-message"), (answer.body && answer.body.message) || "not done (" + answer.status + ")", "error");
  }
  $("#room-form").addEventListener("submit", (e) => { e.preventDefault(); room("set"); });
  $("#room-pause").addEventListener("click", () => room("pause"));
  $("#room-resume").addEventListener("click", () => room("resume"));
  $("#room-remove").addEventListener("click", () => room("remove"));

  setUpSignIn(start);
  start();
  setInterval(paintSales, 1000);
}

if (document.body.dataset.page === "storefront") storefront();
else if (document.body.dataset.page === "console") consolePage();

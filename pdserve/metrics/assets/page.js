// Renders a pdserve page state (pdserve/metrics/views.py: page_state) with plotly.js: the
// HTML report of a run (the state is inlined) and the live dashboard (the state is inlined
// at load, then fetched again every `PDSERVE_LIVE.poll_ms` from `PDSERVE_LIVE.state_url`).
(function () {
  "use strict";
  var current = JSON.parse(document.getElementById("state").textContent);
  var drawn = {};

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var key in attrs || {}) { node.setAttribute(key, attrs[key]); }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function fmt(value, digits) {
    if (value === null || value === undefined) { return "-"; }
    if (typeof value !== "number") { return String(value); }
    return value.toFixed(digits === undefined ? 3 : digits);
  }

  function table(node, columns, rows) {
    node.textContent = "";
    var head = el("tr");
    columns.forEach(function (c) { head.appendChild(el("th", {}, c.label)); });
    node.appendChild(head);
    rows.forEach(function (row) {
      var tr = el("tr");
      columns.forEach(function (c) {
        var td = c.render ? c.render(row) : el("td", c.num ? {"class": "num"} : {}, row[c.key]);
        tr.appendChild(td);
      });
      node.appendChild(tr);
    });
  }

  function renderCards(state) {
    var node = document.getElementById("cards");
    node.textContent = "";
    state.cards.forEach(function (card) {
      var box = el("div", {"class": "card"});
      box.appendChild(el("div", {"class": "label"}, card.label));
      box.appendChild(el("div", {"class": "value"}, card.value));
      node.appendChild(box);
    });
  }

  function renderInstances(state) {
    table(document.getElementById("instances"), [
      {label: "instance", key: "instance"}, {label: "role", key: "role"},
      {label: "state", render: function (r) {
        return el("td", {"class": r.state === "up" ? "ok" : "miss"}, r.state); }},
      {label: "waiting", key: "waiting", num: true},
      {label: "running", key: "running", num: true},
      {label: "KV %", key: "kv_percent", num: true}], state.instances);
  }

  function renderLatency(state) {
    var lat = state.latency;
    if (lat.window_s) {
      document.getElementById("latency-title").textContent =
        "latency against the SLOs, last " + lat.window_s + " s";
    }
    table(document.getElementById("latency"), [
      {label: "metric", key: "metric"},
      {label: "SLO s", key: "slo_s", num: true},
      {label: "mean s", render: function (r) { return el("td", {"class": "num"}, fmt(r.mean_s)); }},
      {label: "p50 s", render: function (r) { return el("td", {"class": "num"}, fmt(r.p50_s)); }},
      {label: "p90 s", render: function (r) {
        return el("td", {"class": "num " + (r.p90_s !== null && r.p90_s > r.slo_s ? "miss" : "ok")},
                  fmt(r.p90_s)); }},
      {label: "p99 s", render: function (r) {
        return el("td", {"class": "num " + (r.p99_s !== null && r.p99_s > r.slo_s ? "miss" : "ok")},
                  fmt(r.p99_s)); }},
      {label: "within SLO", render: function (r) {
        return el("td", {"class": "num"}, r.attained === null ? "-" : fmt(100 * r.attained, 1) + " %"); }}
    ], lat.rows);
    document.getElementById("attainment").textContent = "SLO attainment (both met): " +
      (lat.attainment === null ? "-" : fmt(100 * lat.attainment, 1) + " %") + " of " +
      lat.requests + " requests (" + lat.finished + " finished)";
  }

  function renderFigures(state) {
    var holder = document.getElementById("figures");
    state.figures.forEach(function (item) {
      var div = document.getElementById("fig-" + item.id);
      if (!div) {
        var box = el("section");
        div = el("div", {"id": "fig-" + item.id, "class": "figure"});
        box.appendChild(div);
        holder.appendChild(box);
      }
      var layout = Object.assign({autosize: true}, item.figure.layout);
      if (drawn[item.id]) { layout.uirevision = item.id; }  // keep the user's zoom
      Plotly.react(div, item.figure.data, layout, {responsive: true, displaylogo: false});
      drawn[item.id] = true;
    });
  }

  function renderTables(state) {
    var holder = document.getElementById("tables");
    holder.textContent = "";
    state.tables.forEach(function (t) {
      var box = el("section");
      box.appendChild(el("h2", {}, t.title));
      var node = el("table");
      table(node, t.columns.map(function (c, i) {
        return {label: c, render: function (row) {
          var v = row[i];
          return el("td", typeof v === "number" ? {"class": "num"} : {},
                    typeof v === "number" ? fmt(v, Number.isInteger(v) ? 0 : 3) : v);
        }};
      }), t.rows);
      box.appendChild(node);
      holder.appendChild(box);
    });
  }

  function renderDecisions(state) {
    var select = document.getElementById("kind-filter");
    if (select.options.length === 1) {
      state.decision_kinds.forEach(function (k) { select.appendChild(el("option", {value: k}, k)); });
    }
    var kind = select.value;
    var instance = document.getElementById("instance-filter").value.trim();
    var text = document.getElementById("text-filter").value.trim().toLowerCase();
    var rows = state.decisions.filter(function (d) {
      return (!kind || d.kind === kind) &&
        (!instance || String(d.instance) === instance || String(d.target) === instance) &&
        (!text || d.reason.toLowerCase().indexOf(text) >= 0);
    });
    document.getElementById("log-count").textContent = "(" + rows.length + " shown of " +
      state.decisions.length + " kept, " + state.decisions_total + " in all)";
    table(document.getElementById("decisions"), [
      {label: "time s", render: function (d) { return el("td", {"class": "num"}, fmt(d.time_s, 2)); }},
      {label: "kind", render: function (d) {
        var td = el("td");
        td.appendChild(el("span", {"class": "kind kind-" + d.kind}, d.kind));
        return td; }},
      {label: "instance", render: function (d) {
        var where = d.instance >= 0 ? "#" + d.instance : "-";
        if (d.target >= 0) { where += " \u2192 #" + d.target; }
        if (d.role) { where += " \u2192 " + d.role; }
        return el("td", {}, where); }},
      {label: "request", render: function (d) { return el("td", {}, d.request >= 0 ? d.request : ""); }},
      {label: "reason", key: "reason"}], rows);
  }

  function render(state) {
    current = state;
    document.title = state.title;
    document.getElementById("title").textContent = state.title;
    document.getElementById("subtitle").textContent = state.subtitle;
    renderCards(state);
    var run = state.latency !== null;  // a plan's page shows no run
    document.getElementById("run").style.display = run ? "" : "none";
    document.getElementById("log").style.display = run ? "" : "none";
    if (run) {
      renderInstances(state);
      renderLatency(state);
      renderDecisions(state);
    }
    renderFigures(state);
    renderTables(state);
    document.body.setAttribute("data-updates",
                               String(Number(document.body.getAttribute("data-updates")) + 1));
  }

  ["kind-filter", "instance-filter", "text-filter"].forEach(function (id) {
    document.getElementById(id).addEventListener("input", function () { renderDecisions(current); });
  });
  render(current);

  var live = window.PDSERVE_LIVE;
  if (live) {
    var footer = document.getElementById("footer");
    // a page opened as http://user:key@host/... resolves relative URLs with those
    // credentials, which fetch refuses: drop them (the browser resends its Basic auth)
    var stateUrl = new URL(live.state_url, window.location.href);
    stateUrl.username = "";
    stateUrl.password = "";
    var poll = function () {
      fetch(stateUrl.href, {credentials: "same-origin", cache: "no-store"})
        .then(function (answer) {
          if (!answer.ok) { throw new Error("HTTP " + answer.status); }
          return answer.json();
        })
        .then(function (state) {
          render(state);
          footer.textContent = "live: updated " + new Date().toLocaleTimeString();
        })
        .catch(function (err) { footer.textContent = "live: update failed (" + err + ")"; })
        .finally(function () { setTimeout(poll, live.poll_ms); });
    };
    setTimeout(poll, live.poll_ms);
  }
})();

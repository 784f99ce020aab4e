/* fairq dashboard: the standings chart (uPlot) and CSRF for htmx. No network. */
(function () {
  "use strict";
  document.addEventListener("htmx:configRequest", function (e) {
    var m = document.querySelector('meta[name="csrf-token"]');
    if (m) { e.detail.headers["X-CSRFToken"] = m.content; }
  });

  // A poll answered by the login page (the session expired): go there instead of
  // swapping a whole page into a panel.
  document.addEventListener("htmx:beforeSwap", function (e) {
    var url = e.detail.xhr && e.detail.xhr.responseURL;
    if (url && url.indexOf("/accounts/login/") !== -1) {
      e.detail.shouldSwap = false;
      window.location.assign(url);
    }
  });

  // What the pages once did in inline handlers, which the Content-Security-Policy forbids
  // (script-src 'self'): a form with data-confirm, or the button that submits it, asks
  // first (cancel a job, leave a team, delete a webhook endpoint); the submit form's
  // advanced section remembers being open across the live check's swap (its hidden
  // advanced_open field).
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var button = e.submitter;
    var question = (button && button.getAttribute && button.getAttribute("data-confirm"))
      || (form && form.getAttribute && form.getAttribute("data-confirm"));
    if (question && !window.confirm(question)) { e.preventDefault(); }
  });
  document.addEventListener("toggle", function (e) {  // toggle does not bubble: captured
    var details = e.target;
    if (!details || details.id !== "advanced") { return; }
    var kept = details.querySelector("input[name=advanced_open]");
    if (kept) { kept.value = details.open ? "1" : ""; }
  }, true);

  var palette = ["#2456c7", "#d0582c", "#2f9e55", "#9b3fc4", "#b08900", "#16899a", "#c43f6f", "#59627a"];
  var chart = null;

  function readHistory() {
    var el = document.getElementById("usage-history");
    if (!el) { return null; }
    try { return JSON.parse(el.textContent); } catch (err) { return null; }
  }

  function toData(h) {
    var teams = Object.keys(h.series).sort();
    return { teams: teams, data: [h.t].concat(teams.map(function (t) { return h.series[t]; })) };
  }

  function draw() {
    var box = document.getElementById("usage-chart");
    var h = readHistory();
    if (!box || !h || typeof uPlot === "undefined") { return; }
    var d = toData(h);
    var width = Math.max(260, box.clientWidth);
    if (chart && chart.root.isConnected && chart.series.length === d.teams.length + 1) {
      chart.setData(d.data, false);
      chart.setScale("x", { min: h.start, max: h.t[h.t.length - 1] });
      return;
    }
    if (chart) { chart.destroy(); }
    box.innerHTML = "";
    chart = new uPlot({
      width: width, height: 240,
      series: [{}].concat(d.teams.map(function (t, i) {
        return { label: t, stroke: palette[i % palette.length], width: 2, spanGaps: true,
                 value: function (u, v) { return v == null ? "–" : v.toFixed(2) + " GPU-h"; } };
      })),
      axes: [{}, { label: "decayed GPU-hours", size: 60 }],
      // Always the whole window (with a single point uPlot would invent years of range).
      // The y axis starts at 0, so a small difference between teams does not look large.
      scales: { x: { time: true, range: function () { return [h.start, h.t[h.t.length - 1]]; } },
                y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.08 : 1]; } } },
      legend: { live: false },
    }, d.data, box);
    box.uplot = chart;  // for the browser tests (its scales)
  }

  // The job page: SM activity of the latest attempt, with its tier's idle threshold.
  var utilChart = null;
  function drawUtil() {
    var box = document.getElementById("util-chart");
    var el = document.getElementById("util-series");
    if (!box || !el || typeof uPlot === "undefined") { return; }
    var c;
    try { c = JSON.parse(el.textContent); } catch (err) { return; }
    var data = [c.t, c.sm, c.t.map(function () { return c.threshold; })];
    if (utilChart && utilChart.root.isConnected) { utilChart.setData(data); return; }
    box.innerHTML = "";
    utilChart = new uPlot({
      width: Math.max(260, box.clientWidth), height: 160,
      series: [{}, { label: "SM activity %", stroke: palette[0], width: 2, fill: "rgba(36,86,199,.08)" },
               { label: "idle below", stroke: palette[1], width: 1, dash: [4, 4] }],
      axes: [{}, { size: 40 }],
      scales: { x: { time: true }, y: { range: [0, 100] } },
      legend: { live: false },
    }, data, box);
  }

  document.addEventListener("DOMContentLoaded", function () { draw(); drawUtil(); });
  document.addEventListener("htmx:afterSettle", function () { draw(); drawUtil(); });
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      var box = document.getElementById("usage-chart");
      if (chart && box) { chart.setSize({ width: Math.max(260, box.clientWidth), height: 240 }); }
    }, 150);
  });
})();

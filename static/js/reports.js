// The reports page's charts (templates/web/reports.html): GPU-hours by kind and cost per
// team over time, from the page's #report-series JSON, drawn with the vendored uPlot.
(function () {
  "use strict";
  var palette = ["#2456c7", "#d9730d", "#2e8540", "#b3261e", "#7b3fb5", "#00838f", "#8d6e00",
                 "#c2185b", "#546e7a"];
  var charts = [];

  function line(label, i, unit) {
    return { label: label, stroke: palette[i % palette.length], width: 2,
             value: function (u, v) { return v == null ? "–" : v.toFixed(2) + unit; } };
  }

  function draw() {
    var el = document.getElementById("report-series");
    if (!el || typeof uPlot === "undefined") { return; }
    var c;
    try { c = JSON.parse(el.textContent); } catch (err) { return; }
    charts.forEach(function (ch) { ch.destroy(); });
    charts = [];
    var kinds = ["allocated", "used", "idle", "preempted"];
    var hoursBox = document.getElementById("hours-chart");
    var costBox = document.getElementById("cost-chart");
    var teams = Object.keys(c.cost);
    var opts = function (box, series, axis) {
      return { width: Math.max(260, box.clientWidth), height: 240,
               series: [{}].concat(series), axes: [{}, { label: axis, size: 60 }],
               scales: { x: { time: true } }, legend: { live: false } };
    };
    hoursBox.innerHTML = "";
    charts.push(new uPlot(opts(hoursBox, kinds.map(function (k, i) { return line(k, i, " GPU-h"); }), "GPU-hours"),
                          [c.t].concat(kinds.map(function (k) { return c.hours[k]; })), hoursBox));
    costBox.innerHTML = "";
    charts.push(new uPlot(opts(costBox, teams.map(function (t, i) { return line(t, i, ""); }), "cost"),
                          [c.t].concat(teams.map(function (t) { return c.cost[t]; })), costBox));
  }

  document.addEventListener("DOMContentLoaded", draw);
  var timer = null;
  window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(draw, 150); });
})();
